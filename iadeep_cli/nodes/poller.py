"""``NodePool``: the controller's handle on every node; polls them all at once.

Each node has one persistent connection (``SshConnection``, or ``LocalConnection`` for
``Node.local``).  A poll cycle runs one thread per node and gives each a deadline, so one slow or
dead node shows up as that node's error while every other node's result arrives on time.  A node
whose previous poll is still running (hung) is not polled twice; it reports that instead.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Sequence

from ..errors import IadeepError, NotFoundError
from ..inventory import Inventory, Node
from ..snapshot import ClusterSnapshot, NodeSnapshot
from .gpu import parse_poll, poll_script

log = logging.getLogger("iadeep.nodes")


class NodePool:
    """Persistent connections to the inventory's nodes.

    ``known_hosts``: files to trust keys from (default: ~/.ssh/known_hosts and iadeep's own).
    ``backoff_base``: first wait (s) before reconnecting a node that failed; doubles each time.
    """

    def __init__(self, inventory: Inventory, known_hosts: Sequence[Path] | None = None,
                 connect_timeout: float = 5.0, command_timeout: float = 20.0,
                 backoff_base: float = 1.0, backoff_max: float = 60.0,
                 ssh_config_path: Path | None = None):
        from .local import LocalConnection
        from .ssh import SshConnection

        self.inventory = inventory
        self.connect_timeout, self.command_timeout = connect_timeout, command_timeout
        self._conns = {}
        for node in inventory.nodes:
            cls = LocalConnection if node.local else SshConnection
            self._conns[node.name] = cls(
                node, known_hosts=known_hosts, connect_timeout=connect_timeout,
                command_timeout=command_timeout, backoff_base=backoff_base,
                backoff_max=backoff_max, ssh_config_path=ssh_config_path)
        self._executor = ThreadPoolExecutor(max_workers=max(1, len(self._conns)),
                                            thread_name_prefix="iadeep-poll")
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()

    # -- access
    def node(self, name: str) -> Node:
        node = self.inventory.node(name)
        if node is None:
            known = ", ".join(n.name for n in self.inventory.nodes) or "none"
            raise NotFoundError(f"no node named {name!r} in the inventory (known: {known})",
                                hint="check the name with `iadeep nodes check`")
        return node

    def connection(self, name: str):
        self.node(name)
        return self._conns[name]

    def run(self, node_name: str, cmd, timeout: float | None = None,
            stdin: bytes | None = None) -> tuple[int, str, str]:
        """Run a command on a node over its pooled connection: (rc, stdout, stderr)."""
        return self.connection(node_name).run(cmd, timeout=timeout, stdin=stdin)

    # -- polling
    def poll(self, node_name: str) -> NodeSnapshot:
        """One node's GPUs now; every failure becomes ``NodeSnapshot.error``."""
        node = self.node(node_name)
        start = time.time()
        t0 = time.monotonic()
        try:
            if node.local:
                from .nvml import poll_local
                return poll_local(node.name, node.workdir, node.gpus)
            rc, out, err = self.run(node_name, ["sh", "-c", poll_script(node.workdir)])
        except IadeepError as exc:
            return NodeSnapshot(node.name, start, error=exc.message)
        except Exception as exc:  # a bug or a library surprise: this node's error, not a crash
            log.exception("polling %s failed", node.name)
            return NodeSnapshot(node.name, start, error=f"poll failed: {type(exc).__name__}: {exc}")
        rtt = time.monotonic() - t0
        return parse_poll(node.name, out + ("\n" + err if "@@iadeep gpu" not in out else ""),
                          only=node.gpus, taken_at=start, rtt_s=rtt)

    def poll_all(self, timeout: float | None = None) -> ClusterSnapshot:
        """Every node concurrently (a thread each); a node not done by ``timeout`` is an error.

        The default timeout is connect + command timeout (a poll can need both).
        """
        timeout = self.connect_timeout + self.command_timeout + 1 if timeout is None else timeout
        started = time.time()
        futures: dict[str, Future | None] = {}
        with self._lock:
            for name in self._conns:
                prev = self._inflight.get(name)
                if prev is not None and not prev.done():
                    futures[name] = None
                    continue
                futures[name] = self._inflight[name] = self._executor.submit(self.poll, name)
        wait([f for f in futures.values() if f is not None], timeout=timeout)
        nodes = []
        for name, fut in futures.items():
            if fut is None:
                nodes.append(NodeSnapshot(name, started, error="previous poll still running "
                                                              "(node hung?)"))
            elif not fut.done():
                nodes.append(NodeSnapshot(name, started,
                                          error=f"no poll result within {timeout:g} s"))
            else:
                nodes.append(fut.result())
        return ClusterSnapshot(taken_at=started, nodes=tuple(nodes))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for conn in self._conns.values():
            conn.close()

    def __enter__(self) -> "NodePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

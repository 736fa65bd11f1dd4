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
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

from ..errors import HostKeyError, IadeepError
from ..settings import Inventory, Node
from ..snapshot import ClusterSnapshot, NodeSnapshot
from . import runas
from .backend import Backend
from .connection import NodeConnection
from .gpu import SMI_TIMEOUT_S, Expect, gpu_script, split_sections
from .shell.jobstate import parse_poll, poll_script, state_script, user_states

log = logging.getLogger("iadeep.nodes")


class NodePool:
    """Persistent connections to the inventory's nodes (the real ``connection.Pool``).

    ``known_hosts``: files to trust keys from (default: ~/.ssh/known_hosts and iadeep's own).
    ``backoff_base``: first wait (s) before reconnecting a node that failed; doubles each time.
    ``gpu_timeout``: how long nvidia-smi may take on a node before it is killed (the GPU data
    is then missing for that round; the node still answers and its jobs are still known).
    """

    def __init__(self, inventory: Inventory, known_hosts: Sequence[Path] | None = None,
                 connect_timeout: float = 5.0, command_timeout: float = 20.0,
                 backoff_base: float = 1.0, backoff_max: float = 60.0,
                 ssh_config_path: Path | None = None, gpu_timeout: float = SMI_TIMEOUT_S):
        from .local import LocalConnection
        from .ssh import SshConnection

        self.inventory = inventory
        self.connect_timeout, self.command_timeout = connect_timeout, command_timeout
        self.gpu_timeout = gpu_timeout
        self._conns: dict[str, NodeConnection] = {
            node.name: LocalConnection(node, command_timeout) if node.local else SshConnection(
                node, known_hosts=known_hosts, connect_timeout=connect_timeout,
                command_timeout=command_timeout, backoff_base=backoff_base,
                backoff_max=backoff_max, ssh_config_path=ssh_config_path)
            for node in inventory.nodes}
        self._executor = ThreadPoolExecutor(max_workers=max(1, len(self._conns)),
                                            thread_name_prefix="iadeep-poll")
        self._inflight: dict[str, Future[NodeSnapshot]] = {}   # each node's latest poll
        # polls whose result was already returned
        self._consumed: set[Future[NodeSnapshot]] = set()
        self._since: dict[str, float] = {}         # when a node's unfinished poll began
        self._lock = threading.Lock()
        self._user_errors: dict[str, dict[str, str]] = {}   # node -> user -> why (logged)

    # -- access
    def node(self, name: str) -> Node:
        return self.inventory.require_node(name)

    def connection(self, name: str) -> NodeConnection:
        self.node(name)
        return self._conns[name]

    def backend(self, name: str) -> Backend:
        """Job control on node ``name``: the shell's, over its pooled connection."""
        from .shell import ShellBackend
        return ShellBackend(self, name)

    def run(self, node_name: str, cmd: str | Sequence[str], timeout: float | None = None,
            stdin: bytes | None = None) -> tuple[int, str, str]:
        """Run a command on a node over its pooled connection: (rc, stdout, stderr)."""
        return self.connection(node_name).run(cmd, timeout=timeout, stdin=stdin)

    # -- polling
    def poll(self, node_name: str, expect: Expect = (),
             owners: Mapping[int, str] | None = None,
             progress: Mapping[int, int] | None = None) -> NodeSnapshot:
        """One node's GPUs and expected jobs now; every failure becomes ``NodeSnapshot.error``
        (with ``jobs`` None when the node did not answer at all).  ``owners``: job id -> owner,
        which a ``run_as: submitter`` node needs to read each job as its owner; ``progress``:
        job id -> offset, the running jobs whose new progress to read in the same command."""
        node = self.node(node_name)
        ids = {int(j) for j, _, _ in expect}
        progress = {int(j): int(o) for j, o in (progress or {}).items() if int(j) in ids}
        snap = self._poll(node, expect, owners, progress)
        return replace(snap, progress_asked=tuple(sorted(progress))) if snap.reached else snap

    def _poll(self, node: Node, expect: Expect, owners: Mapping[int, str] | None,
              progress: dict[int, int]) -> NodeSnapshot:
        """``poll``'s one command (or NVML and the local shell, for the controller's own node)
        and its parsing."""
        node_name = node.name
        start = time.time()
        t0 = time.monotonic()
        try:
            if node.local:
                from .nvml import poll_local
                return poll_local(node.name, node.workdir, node.gpus, expect, progress)
            mine = None
            if node.submitter:
                mine = {int(j): (owners or {}).get(int(j), "") for j, _, _ in expect}
                script = self._submitter_script(node, expect, mine, progress)
            else:
                script = poll_script(node.workdir, expect, self.gpu_timeout, progress)
            _, out, err = self.run(node_name, ["sh", "-c", script])
        except HostKeyError as exc:   # what to do about it is part of the news
            return NodeSnapshot(node.name, start, error=f"{exc.message} ({exc.hint})"
                                if exc.hint else exc.message)
        except IadeepError as exc:
            return NodeSnapshot(node.name, start, error=exc.message)
        except Exception as exc:  # a bug or a library surprise: this node's error, not a crash
            log.exception("polling %s failed", node.name)
            return NodeSnapshot(node.name, start, error=f"poll failed: {type(exc).__name__}: {exc}")
        rtt = time.monotonic() - t0
        snap = parse_poll(node.name, out + ("\n" + err if "@@iadeep gpu" not in out else ""),
                          only=node.gpus, taken_at=start, rtt_s=rtt, owners=mine,
                          expected=[int(j) for j, _, _ in expect])
        if mine is not None:
            self._note_user_errors(node.name, out)
        return snap

    def _submitter_script(self, node: Node, expect: Expect, owners: dict[int, str],
                          progress: Mapping[int, int]) -> str:
        """The SSH account's own (empty) state section, each owner's jobs (states and new
        progress) read as that owner (``runas.poll_sections``; an owner unknown here gets
        none: their jobs are unknown), then the GPUs.  Each user's part is bounded in time
        and bytes so that all of them fit the poll."""
        by_user: dict[str, list[tuple[int, int | None, int | None]]] = {}
        for j, p, t in expect:
            if owners.get(int(j)):
                by_user.setdefault(owners[int(j)], []).append((j, p, t))
        wd = runas.user_workdir(node)
        each = max(2.0, self.gpu_timeout / max(1, len(by_user)))
        scripts = {u: state_script(wd, e, {int(j): progress[int(j)] for j, _, _ in e
                                           if int(j) in progress},
                                   timeout_s=max(1.0, each - 1), budget=runas.SECTION_MAX // 2)
                   for u, e in by_user.items()}
        return (state_script(node.workdir, ()) + runas.poll_sections(node, scripts, each) +
                gpu_script(self.gpu_timeout))

    def _note_user_errors(self, node: str, out: str) -> None:
        """Log (once per change) a user whose jobs could not be read on a submitter node."""
        errors = user_states(split_sections(out), {}).errors
        with self._lock:
            before = self._user_errors.get(node, {})
            self._user_errors[node] = errors
        for user, why in errors.items():
            if before.get(user) != why:
                log.warning("node %s: the jobs of %s cannot be read as %s: %s", node, user,
                            user, why)

    def poll_all(self, expect: Mapping[str, Expect] | None = None,
                 wait_s: float | None = None,
                 owners: Mapping[int, str] | None = None,
                 progress: Mapping[int, int] | None = None) -> ClusterSnapshot:
        """Every node concurrently (a thread each), waiting at most ``wait_s`` for them.

        A node that is not done by then does not hold up the others: its poll goes on in the
        background and its result is used by the next call that finds it done (so a slow node
        is seen late, never lost); while it is still running, the node reports how long it has
        been silent.  Only the polls started by this call are waited for: a node still hung
        from an earlier round costs the others nothing (else every round would wait out
        ``wait_s`` for it, and the healthy nodes' data would age by that much each round).
        ``expect``: per node, the jobs whose state to read (see ``state_script``);
        ``owners``: job id -> owner (needed on ``run_as: submitter`` nodes); ``progress``: job
        id -> offset, the running jobs whose new progress each node's poll reads too.
        """
        expect = expect or {}
        wait_s = self.connect_timeout + self.command_timeout + 1 if wait_s is None else wait_s
        started = time.time()
        futures: dict[str, Future[NodeSnapshot]] = {}
        fresh: list[Future[NodeSnapshot]] = []
        with self._lock:
            for name in self._conns:
                prev = self._inflight.get(name)
                if prev is None or (prev.done() and prev in self._consumed):
                    prev = self._executor.submit(self.poll, name, tuple(expect.get(name, ())),
                                                 dict(owners or {}), dict(progress or {}))
                    self._inflight[name] = prev
                    self._since.setdefault(name, started)
                    fresh.append(prev)
                futures[name] = prev
        wait(fresh, timeout=wait_s)
        nodes = []
        with self._lock:
            for name, fut in futures.items():
                if fut.done():
                    self._consumed.add(fut)
                    self._consumed &= set(self._inflight.values())
                    self._since.pop(name, None)
                    nodes.append(fut.result())
                else:
                    silent = time.time() - self._since.get(name, started)
                    nodes.append(NodeSnapshot(name, started, error=f"no answer for {silent:.0f} s"
                                              " (its poll is still running)"))
        return ClusterSnapshot(taken_at=started, nodes=tuple(nodes))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for conn in self._conns.values():
            conn.close()

    def __enter__(self) -> NodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Running the controller process: lock, socket, loop, clean stop on SIGINT/SIGTERM."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from .. import paths
from ..inventory import Inventory
from ..store import Store, cluster
from .server import ControllerSocket
from .service import Service

log = logging.getLogger("iadeep.controller")


class Controller:
    """Owns the store, the socket and the scheduling loop for one state directory."""

    def __init__(self, inventory: Inventory, state_dir: Path | None = None,
                 clock: Callable[[], float] = time.time):
        self.inventory = inventory
        self.state_dir = state_dir or paths.state_dir()
        self.clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(self.state_dir / "iadeep.db")
        self.scripts_dir = self.state_dir / "scripts"   # copies taken at submission
        self.service = Service(self.store, inventory, clock, scripts_dir=self.scripts_dir)
        self.service.wake = self._wake.set
        self.socket = ControllerSocket(self.service, self.state_dir)
        self.loop = self._make_loop() if inventory.nodes else None
        self.started_at = clock()

    def _make_loop(self):
        """Node connections and the scheduling loop (paramiko and numpy load only here)."""
        from ..nodes.launcher import read_log
        from ..nodes.poller import NodePool
        from .loop import SchedulingLoop

        # A node that stopped answering is retried at least once per grace period.
        for node in self.inventory.nodes:
            if node.local:
                log.warning("node %s is local: its jobs run as the controller's own account and "
                            "could change its state; see README 'Security model'", node.name)
        pool = NodePool(_scoped_workdirs(self.inventory, self._install_id()),
                        backoff_max=min(60.0, max(5.0, self.inventory.node_grace_s)))

        def logs(job, offset: int, max_bytes: int) -> dict:
            return read_log(pool, job.node, job.id, offset, max_bytes).reply()

        self.service.log_reader = logs
        return SchedulingLoop(self.store, self.inventory, pool, self.scripts_dir,
                              self.clock)

    def heartbeat(self, **extra) -> None:
        with self.store.tx() as conn:
            cluster.set_meta(conn, "controller", {
                "pid": os.getpid(), "started_at": self.started_at,
                "heartbeat_at": self.clock(), "poll_interval_s": self.inventory.poll_interval_s,
                "aging_per_hour": self.inventory.policy.aging_per_hour,
                "nodes": [n.name for n in self.inventory.nodes], **extra})

    def run(self, on_ready: Callable[[], None] = lambda: None) -> None:
        """Serve until stop(); each tick runs one scheduling round (if a loop is attached)."""
        self.socket.start()
        self.heartbeat()
        on_ready()
        try:
            while not self._stop.is_set():
                if self.loop is not None:
                    self._tick()
                self.heartbeat()
                self._wake.wait(self.inventory.poll_interval_s)
                self._wake.clear()
        finally:
            self.socket.close()
            self.heartbeat(stopped_at=self.clock())
            if self.loop is not None:
                self.loop.close()
            self.store.close()

    def _install_id(self) -> str:
        """A random id made once per database; see _scoped_workdirs."""
        with self.store.tx() as conn:
            install_id = cluster.get_meta(conn, "install_id")
            if install_id is None:
                install_id = uuid.uuid4().hex[:12]
                cluster.set_meta(conn, "install_id", install_id)
        return install_id

    def _tick(self) -> None:
        """One round; a bug in one round is logged, not allowed to stop the controller."""
        try:
            self.loop.tick()
        except Exception:
            log.exception("scheduling round failed; retrying next interval")

    def stop(self, *_args) -> None:
        self._stop.set()
        self._wake.set()


def _scoped_workdirs(inventory: Inventory, install_id: str) -> Inventory:
    """Job directories live under WORKDIR/<install id>/<node>/jobs/<job id>:
    - the install id: job ids restart at 1 with a new database, and a new controller must never
      mistake an old job's directory (pid file, exit code) for its own job's;
    - the node name: labs often share home directories over NFS, and a job retried on another
      node must not find its first attempt's directory there."""
    nodes = tuple(dataclasses.replace(
        n, workdir=f"{n.workdir.rstrip('/')}/{install_id}/{n.name}") for n in inventory.nodes)
    return dataclasses.replace(inventory, nodes=nodes)


def run_forever(inventory: Inventory, on_ready: Callable[[], None] = lambda: None) -> None:
    controller = Controller(inventory)
    signal.signal(signal.SIGTERM, controller.stop)
    signal.signal(signal.SIGINT, controller.stop)
    controller.run(on_ready)

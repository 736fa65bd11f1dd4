"""Running the controller process: lock, socket, loop, clean stop on SIGINT/SIGTERM."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from .. import paths
from ..inventory import Inventory
from ..store import Store, cluster
from .server import ControllerSocket
from .service import Service


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
        self.service = Service(self.store, inventory, clock)
        self.service.wake = self._wake.set
        self.socket = ControllerSocket(self.service, self.state_dir)
        self.loop = None  # set by attach_loop when the inventory has nodes
        self.started_at = clock()

    def heartbeat(self, **extra) -> None:
        with self.store.tx() as conn:
            cluster.set_meta(conn, "controller", {
                "pid": os.getpid(), "started_at": self.started_at,
                "heartbeat_at": self.clock(), "poll_interval_s": self.inventory.poll_interval_s,
                "nodes": [n.name for n in self.inventory.nodes], **extra})

    def run(self, on_ready: Callable[[], None] = lambda: None) -> None:
        """Serve until stop(); each tick runs one scheduling round (if a loop is attached)."""
        self.socket.start()
        self.heartbeat()
        on_ready()
        try:
            while not self._stop.is_set():
                if self.loop is not None:
                    self.loop.tick()
                self.heartbeat()
                self._wake.wait(self.inventory.poll_interval_s)
                self._wake.clear()
        finally:
            self.socket.close()
            self.heartbeat(stopped_at=self.clock())
            if self.loop is not None:
                self.loop.close()
            self.store.close()

    def stop(self, *_args) -> None:
        self._stop.set()
        self._wake.set()


def run_forever(inventory: Inventory, on_ready: Callable[[], None] = lambda: None) -> None:
    controller = Controller(inventory)
    signal.signal(signal.SIGTERM, controller.stop)
    signal.signal(signal.SIGINT, controller.stop)
    controller.run(on_ready)

"""One worker thread per node for what the controller does there (``NodeActions``).

The scheduling round (``controller/round/loop.py``) never waits for a node: a launch, a cancel, a
signal or a clean-up is queued on its node's worker, so a hung node holds up only its own work.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("iadeep.controller")


class NodeActions:
    """One worker thread per node for what the loop does there (launch, cancel, clean up).

    Actions on one node run in order; a node that hangs delays only its own queue.  An action
    is keyed (e.g. ``("launch", 12)``): the same key is not queued twice while one is pending,
    and ``busy(job_id)`` tells reconcile to leave that job alone until its action is done.
    """

    def __init__(self) -> None:
        self._workers: dict[str, ThreadPoolExecutor] = {}
        self._pending: set[tuple[Any, ...]] = set()
        self._done_at: dict[int, float] = {}   # job id -> when its last action ended
        self._lock = threading.Lock()

    def submit(self, node: str, key: tuple[Any, ...], fn: Callable[[], None]) -> bool:
        with self._lock:
            if key in self._pending:
                return False
            self._pending.add(key)
            worker = self._workers.get(node)
            if worker is None:
                worker = self._workers[node] = ThreadPoolExecutor(
                    1, thread_name_prefix=f"iadeep-{node}")
        worker.submit(self._run, key, fn)
        return True

    def _run(self, key: tuple[Any, ...], fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:   # a bug in one action must not kill the node's worker
            log.exception("action %s failed", key)
        finally:
            with self._lock:
                self._pending.discard(key)
                self._done_at[key[1]] = time.time()   # wall clock, like a poll's taken_at

    def busy(self, job_id: int) -> bool:
        with self._lock:
            return any(key[1] == job_id for key in self._pending)

    def acted_at(self, job_id: int) -> float:
        with self._lock:
            return self._done_at.get(job_id, 0.0)

    def drain(self, timeout: float = 10.0) -> None:
        """Wait (bounded) for queued actions: tests and a clean shutdown."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    return
            time.sleep(0.02)

    def close(self) -> None:
        for worker in self._workers.values():
            worker.shutdown(wait=False, cancel_futures=True)

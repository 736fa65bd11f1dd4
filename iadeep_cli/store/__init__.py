"""The controller's durable state: one SQLite database in the state directory.

``Store`` owns the connection and a lock; the modules beside it (``jobs``, ``cluster``) hold the
queries, each a function of a connection, so they compose inside one transaction::

    with store.tx() as conn:
        jobs.transition(conn, job_id, JobState.RUNNING, "started", "controller", now)
"""
from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Iterator

from .. import paths
from . import db


class Store:
    def __init__(self, path: Path | None = None, *, readonly: bool = False):
        self.path = Path(path) if path else paths.db_path()
        self.readonly = readonly
        self._conn = db.connect(self.path, readonly=readonly)
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One atomic, durable transaction (BEGIN IMMEDIATE: writers queue, never deadlock)."""
        with self._lock:
            if self.readonly:
                yield self._conn
                return
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

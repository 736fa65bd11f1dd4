"""The controller's durable state: one SQLite database in the state directory.

``Store`` owns the connection and a lock; the modules beside it (``jobs``, ``cluster``) hold the
queries, each a function of a connection, so they compose inside one transaction::

    with store.tx() as conn:
        jobs.transition(conn, job_id, JobState.RUNNING, "started", "controller", now)

Reads that answer requests (``queue list``, ``status``...) go through ``Store.read()``: a snapshot
on a read-only connection of their own, never the writer's lock, so a member
reading a long history cannot hold up a round (in WAL mode a reader and the writer never block
each other).

The writer's store also guards the two ways a database goes bad under a running controller
without SQLite noticing: a full disk (reported as one clear error, never half a transaction) and
the file being removed or replaced (SQLite would keep writing into the unlinked inode, and
everything accepted since would vanish at the next start).
"""
from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from .. import paths
from ..errors import StoreError
from . import db

PRIVATE = 0o600   # the database holds every job's env values and arguments
_DAMAGE_CODES = (11, 26)   # SQLITE_CORRUPT, SQLITE_NOTADB
_SIDE_FILES = ("", "-wal", "-shm")


class Store:
    def __init__(self, path: Path | None = None, *, readonly: bool = False):
        self.path = Path(path) if path else paths.StateDir.default().db
        self.readonly = readonly
        self._conn = db.connect(self.path, readonly=readonly)
        self._lock = threading.RLock()
        self._identity = None if readonly else _file_id(self.path)
        self.damaged: StoreError | None = None   # check_damage found it damaged (for good)
        if not readonly:
            for suffix in _SIDE_FILES:   # SQLite gives -wal/-shm the database's mode
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(f"{self.path}{suffix}", PRIVATE)

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One atomic, durable transaction (BEGIN IMMEDIATE: writers queue, never deadlock)."""
        with self._lock:
            if self.readonly:
                yield self._conn
                return
            lost = self.identity_problem()
            if lost is not None:
                raise lost
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException as exc:
                # A failed COMMIT (disk full) may leave the transaction open: end it, or every
                # later BEGIN would fail too.
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                full = _full_error(exc, self.path.parent)
                if full is None:
                    raise
                raise full from None

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One consistent read snapshot (a read transaction) on a read-only connection of its
        own: it neither takes nor waits for the writer's lock, and sees only committed state.
        A connection per read (opening one costs well under a millisecond; one kept open
        across a replaced database, see ``rescue``, would later write into the new one). A
        read-only store reads through its own connection, under its lock."""
        if self.readonly:
            with self._lock:
                self._conn.execute("BEGIN")
                try:
                    yield self._conn
                finally:
                    self._conn.rollback()
            return
        lost = self.identity_problem()
        if lost is not None:
            raise lost
        conn = db.connect(self.path, readonly=True)
        try:
            conn.execute("BEGIN")
            yield conn
        finally:
            conn.close()

    def check_damage(self) -> StoreError | None:
        """A StoreError if the database on disk is damaged (``PRAGMA quick_check`` through a
        fresh read-only connection: what is on disk, not what a connection has cached), else
        None; once found it stays (``damaged``). An error that is no verdict on the file (no
        descriptor left, busy) is None."""
        if self.damaged is not None or self.readonly:
            return self.damaged
        detail = None
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
            try:
                row = conn.execute("PRAGMA quick_check(1)").fetchone()
            finally:
                conn.close()
            if row is None or row[0] != "ok":
                detail = str(row[0]) if row else "no answer"
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                return None
            detail = str(exc)
        if detail is None:
            return None
        self.damaged = StoreError(
            f"the controller's database {self.path} is damaged ({detail[:200]}); it refuses "
            "new jobs and keeps the running ones", hint=f"stop the controller and restore "
            f"{self.path} from a backup (or `sqlite3 {self.path} .recover`)")
        return self.damaged

    def identity_problem(self) -> StoreError | None:
        """Why this store must stop writing: its file was removed or replaced, else None."""
        if self.readonly or _file_id(self.path) == self._identity:
            return None
        return StoreError(
            f"the controller's database {self.path} was removed or replaced while it ran; "
            "it stopped writing to protect the jobs it holds",
            hint=f"stop the controller, put {rescue_path(self.path)} (its copy of the jobs) "
                 f"back at {self.path}, start it again")

    def rescue(self) -> Path:
        """Copy what this connection still sees (the unlinked file stays readable through it)
        next to where the database was, so no accepted job is lost. Then remove its -wal and
        -shm: SQLite finds those by name and would replay this database's pages into whatever
        file is now at the path (a restored backup, another installation's database)."""
        target = rescue_path(self.path)
        with self._lock:
            copy = sqlite3.connect(target)
            try:
                self._conn.backup(copy)
            finally:
                copy.close()
            os.chmod(target, PRIVATE)
            for suffix in _SIDE_FILES[1:]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self.path}{suffix}")
        return target

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def is_damage(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite saying the file is damaged (not busy, not out of files)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    return (getattr(exc, "sqlite_errorcode", None) in _DAMAGE_CODES
            or "malformed" in str(exc) or "not a database" in str(exc))


def rescue_path(path: Path) -> Path:
    return path.with_name(path.name + ".rescued")


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _full_error(exc: BaseException, where: Path) -> StoreError | None:
    """The one error for "no room left in the state directory" (SQLite's SQLITE_FULL or an
    ENOSPC/EDQUOT from writing a script copy), else None."""
    full = (isinstance(exc, sqlite3.Error) and "disk is full" in str(exc)) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT))
    return state_dir_full(where) if full else None


def state_dir_full(where: Path) -> StoreError:
    return StoreError(f"the controller's state directory is full ({where}); "
                      "it refuses new jobs until there is room again",
                      hint=f"free space in {where}")

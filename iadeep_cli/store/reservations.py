"""Reservation rows (`iadeep reserve`): GPUs kept for a user over a window of time.

Rows are plain tuples here (the store sits below the scheduler, whose ``Reservation`` value
the controller builds from them): (id, user, gpus, node, start, end, created_by, created_at).
"""
from __future__ import annotations

import sqlite3

from ..errors import NotFoundError

Row = tuple[int, str, int, str | None, float, float, str, float]
_COLUMNS = "id, user, gpus, node, start, end, created_by, created_at"


def add(conn: sqlite3.Connection, user: str, gpus: int, node: str | None, start: float,
        end: float, created_by: str, now: float) -> int:
    """Record a reservation; its id."""
    cur = conn.execute("INSERT INTO reservations (user, gpus, node, start, end, created_by, "
                       "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (user, gpus, node, start, end, created_by, now))
    return int(cur.lastrowid or 0)


def current(conn: sqlite3.Connection, now: float) -> list[Row]:
    """Reservations not over at ``now``, by start."""
    return [tuple(r) for r in conn.execute(
        f"SELECT {_COLUMNS} FROM reservations WHERE end > ? ORDER BY start, id", (now,))]


def delete(conn: sqlite3.Connection, reservation_id: int) -> Row:
    """Remove a reservation; the row it was (NotFoundError if there is none)."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM reservations WHERE id = ?",
                       (reservation_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no reservation {reservation_id}",
                            hint="`iadeep reserve list` shows them")
    conn.execute("DELETE FROM reservations WHERE id = ?", (reservation_id,))
    return tuple(row)

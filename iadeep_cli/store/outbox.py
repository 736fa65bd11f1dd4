"""The notification outbox: messages owed to job owners, kept until sent or given up.

A notification is owed once its job event is committed (the events table is the source), and
it is written here in the same transaction that moves the read cursor past that event, so a
controller killed at any moment neither forgets one nor queues one twice (the unique index on
event and channel makes a second insert a no-op). A row is marked sent only after the channel
accepted it; a controller killed between the two sends that one again on restart.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from .cluster import get_meta, set_meta
from .jobrows import ARRAY_ID

CURSOR = "notify_cursor"   # the last events.id read for notifications (meta)
# The outboxes, one table each with the same delivery columns (channel, next_at, sent_at,
# gave_up_at, attempts, error) and one set of statements over them (``next_due``,
# ``mark_sent``, ``mark_failed``): the job owners' notifications, and the admins' messages about
# foreign processes holding a GPU idle (``store/foreign.py`` queues those).
JOBS = "notifications"
FOREIGN = "foreign_notes"
BOXES = (JOBS, FOREIGN)


@dataclass(frozen=True)
class Event:
    id: int
    job_id: int
    old_state: str | None
    new_state: str
    reason: str = ""
    kind: str | None = None   # what the event was beyond its states ('idle': jobrows.IDLE)


@dataclass(frozen=True)
class Pending:
    """One message to one channel, as queued."""

    id: int
    job_id: int
    kind: str        # 'start' or 'end'
    state: str       # the job's state the event moved it to
    channel: str     # 'email' or 'webhook'
    attempts: int


def events_after(conn: sqlite3.Connection, limit: int = 1000) -> list[Event]:
    """Up to ``limit`` events past the cursor, oldest first."""
    after = int(get_meta(conn, CURSOR, 0))
    rows = conn.execute("SELECT id, job_id, old_state, new_state, reason, kind FROM events "
                        "WHERE id > ? ORDER BY id LIMIT ?", (after, limit)).fetchall()
    return [Event(r["id"], r["job_id"], r["old_state"], r["new_state"], r["reason"] or "",
                  r["kind"]) for r in rows]


def advance(conn: sqlite3.Connection, event_id: int) -> None:
    set_meta(conn, CURSOR, event_id)


def enqueue(conn: sqlite3.Connection, event: Event, kind: str, channel: str, now: float,
            job_id: int | None = None, state: str | None = None) -> None:
    """Queue one message for ``event``; an array's ('array_start', 'array_end') is queued under
    the array's id (``job_id``) with the array's ``state``."""
    conn.execute("INSERT OR IGNORE INTO notifications (job_id, event_id, kind, state, channel, "
                 "created_at, next_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                 (event.job_id if job_id is None else job_id, event.id, kind,
                  event.new_state if state is None else state, channel, now, now))


def queued(conn: sqlite3.Connection, job_id: int, kind: str, channel: str) -> bool:
    """Whether a ``kind`` message of ``job_id`` was ever queued for ``channel`` (an array's
    start and end are queued once, whichever of its tasks' events comes first)."""
    return conn.execute("SELECT 1 FROM notifications WHERE job_id=? AND kind=? AND channel=? "
                        "LIMIT 1", (job_id, kind, channel)).fetchone() is not None


def array_counts(conn: sqlite3.Connection, array_id: int) -> dict[str, int]:
    """How many of array ``array_id``'s tasks are in each state (one indexed count)."""
    rows = conn.execute(f"SELECT state, COUNT(*) FROM jobs WHERE {ARRAY_ID} = ? "
                        "GROUP BY state", (array_id,)).fetchall()
    return {r[0]: r[1] for r in rows}


def due(conn: sqlite3.Connection, now: float, channel: str, limit: int = 100) -> list[Pending]:
    """Unsent notifications of ``channel`` whose next try is due, oldest first."""
    rows = conn.execute("SELECT id, job_id, kind, state, channel, attempts FROM notifications "
                        "WHERE sent_at IS NULL AND gave_up_at IS NULL AND channel = ? "
                        "AND next_at <= ? ORDER BY next_at, id LIMIT ?",
                        (channel, now, limit)).fetchall()
    return [Pending(r["id"], r["job_id"], r["kind"], r["state"], r["channel"], r["attempts"])
            for r in rows]


def next_due(conn: sqlite3.Connection, channel: str, box: str | None = None) -> float | None:
    """When the next unsent message of ``channel`` in ``box`` is due (None: every outbox;
    None back: nothing waits)."""
    first: float | None = None
    for table in _boxes(box):
        row = conn.execute(f"SELECT MIN(next_at) FROM {table} WHERE sent_at IS NULL "
                           "AND gave_up_at IS NULL AND channel = ?", (channel,)).fetchone()
        if row[0] is not None:
            first = float(row[0]) if first is None else min(first, float(row[0]))
    return first


def mark_sent(conn: sqlite3.Connection, note_id: int, now: float, box: str = JOBS) -> None:
    [table] = _boxes(box)
    conn.execute(f"UPDATE {table} SET sent_at=?, attempts=attempts+1, error='' WHERE id=?",
                 (now, note_id))


def mark_failed(conn: sqlite3.Connection, note_id: int, now: float, error: str,
                retry_at: float | None, box: str = JOBS) -> None:
    """One more failed try: retried at ``retry_at``, or given up when that is None."""
    [table] = _boxes(box)
    if retry_at is None:
        conn.execute(f"UPDATE {table} SET attempts=attempts+1, error=?, gave_up_at=? "
                     "WHERE id=?", (error[:500], now, note_id))
    else:
        conn.execute(f"UPDATE {table} SET attempts=attempts+1, error=?, next_at=? "
                     "WHERE id=?", (error[:500], retry_at, note_id))


def _boxes(box: str | None) -> tuple[str, ...]:
    """The outbox tables ``box`` names (None: both); only these reach the SQL."""
    if box is None:
        return BOXES
    if box not in BOXES:
        raise ValueError(f"no outbox {box!r}")
    return (box,)


def for_job(conn: sqlite3.Connection, job_id: int) -> list[dict[str, Any]]:
    """Every notification of a job, as stored (tests, and an admin reading the database)."""
    rows = conn.execute("SELECT * FROM notifications WHERE job_id=? ORDER BY id", (job_id,))
    return [dict(r) for r in rows.fetchall()]

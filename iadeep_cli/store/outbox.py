"""The outbox: every message owed, kept until sent or given up, in one table (``outbox``).

Two kinds of message wait there, with the same delivery state (channel, next try, sent, given
up, tries, last error) and one set of statements over it (``due``, ``next_due``, ``mark_sent``,
``mark_failed``), so one delivery loop (``controller/notify.Notifier.deliver``) sends both:

- a job owner's notification (``enqueue``): one row per job event and channel. It is owed once
  its job event is committed (the events table is the source), and it is written here in the
  same transaction that moves the read cursor past that event, so a controller killed at any
  moment neither forgets one nor queues one twice (the unique index on event and channel makes
  a second insert a no-op);
- a message to the lab's admins about a process iadeep did not start holding a GPU idle
  (``enqueue_spell``, ``store/foreign.py`` keeps the spells): one row per spell, channel and
  admin (for e-mail), queued in the transaction that records the spell.

A row is marked sent only after the channel accepted it; a controller killed between the two
sends that one again on restart.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from .cluster import get_meta, set_meta
from .jobrows import ARRAY_ID

CURSOR = "notify_cursor"   # the last events.id read for notifications (meta)
SPELL = "foreign_idle"     # the kind of a message about a foreign process's idle spell


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
    """One message to one channel, as queued: about a job (``job_id``; ``state``: the state
    its event moved it to) or, of kind ``SPELL``, about a foreign process's idle spell
    (``foreign_id``, to the admin ``recipient`` by e-mail)."""

    id: int
    kind: str        # 'start', 'end', 'idle', 'array_start', 'array_end', or SPELL
    channel: str     # 'email' or 'webhook'
    attempts: int
    job_id: int | None = None
    state: str = ""
    foreign_id: int | None = None
    recipient: str = ""


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
    conn.execute("INSERT OR IGNORE INTO outbox (job_id, event_id, kind, state, channel, "
                 "created_at, next_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                 (event.job_id if job_id is None else job_id, event.id, kind,
                  event.new_state if state is None else state, channel, now, now))


def queued(conn: sqlite3.Connection, job_id: int, kind: str, channel: str) -> bool:
    """Whether a ``kind`` message of ``job_id`` was ever queued for ``channel`` (an array's
    start and end are queued once, whichever of its tasks' events comes first)."""
    return conn.execute("SELECT 1 FROM outbox WHERE job_id=? AND kind=? AND channel=? "
                        "LIMIT 1", (job_id, kind, channel)).fetchone() is not None


def array_counts(conn: sqlite3.Connection, array_id: int) -> dict[str, int]:
    """How many of array ``array_id``'s tasks are in each state (one indexed count)."""
    rows = conn.execute(f"SELECT state, COUNT(*) FROM jobs WHERE {ARRAY_ID} = ? "
                        "GROUP BY state", (array_id,)).fetchall()
    return {r[0]: r[1] for r in rows}


def enqueue_spell(conn: sqlite3.Connection, spell_id: int, channel: str, recipient: str,
                  now: float) -> None:
    """Queue the admins' message about foreign spell ``spell_id`` for ``channel`` (e-mail:
    one a ``recipient``, an admin's name); a second one for the same is a no-op."""
    conn.execute("INSERT OR IGNORE INTO outbox (foreign_id, kind, channel, recipient, "
                 "created_at, next_at) VALUES (?, ?, ?, ?, ?, ?)",
                 (spell_id, SPELL, channel, recipient, now, now))


def due(conn: sqlite3.Connection, now: float, channel: str, limit: int = 100) -> list[Pending]:
    """Unsent messages of ``channel`` whose next try is due, of either kind, oldest first."""
    rows = conn.execute("SELECT id, kind, channel, attempts, job_id, state, foreign_id, "
                        "recipient FROM outbox "
                        "WHERE sent_at IS NULL AND gave_up_at IS NULL AND channel = ? "
                        "AND next_at <= ? ORDER BY next_at, id LIMIT ?",
                        (channel, now, limit)).fetchall()
    return [Pending(r["id"], r["kind"], r["channel"], r["attempts"], r["job_id"], r["state"],
                    r["foreign_id"], r["recipient"]) for r in rows]


def next_due(conn: sqlite3.Connection, channel: str) -> float | None:
    """When the next unsent message of ``channel`` is due (None: nothing waits)."""
    row = conn.execute("SELECT MIN(next_at) FROM outbox WHERE sent_at IS NULL "
                       "AND gave_up_at IS NULL AND channel = ?", (channel,)).fetchone()
    return None if row[0] is None else float(row[0])


def mark_sent(conn: sqlite3.Connection, note_id: int, now: float) -> None:
    conn.execute("UPDATE outbox SET sent_at=?, attempts=attempts+1, error='' WHERE id=?",
                 (now, note_id))


def mark_failed(conn: sqlite3.Connection, note_id: int, now: float, error: str,
                retry_at: float | None) -> None:
    """One more failed try: retried at ``retry_at``, or given up when that is None."""
    if retry_at is None:
        conn.execute("UPDATE outbox SET attempts=attempts+1, error=?, gave_up_at=? "
                     "WHERE id=?", (error[:500], now, note_id))
    else:
        conn.execute("UPDATE outbox SET attempts=attempts+1, error=?, next_at=? "
                     "WHERE id=?", (error[:500], retry_at, note_id))


def for_job(conn: sqlite3.Connection, job_id: int) -> list[dict[str, Any]]:
    """Every notification of a job, as stored (tests, and an admin reading the database)."""
    rows = conn.execute("SELECT * FROM outbox WHERE job_id=? ORDER BY id", (job_id,))
    return [dict(r) for r in rows.fetchall()]


def for_spell(conn: sqlite3.Connection, spell_id: int) -> list[dict[str, Any]]:
    """Every message about a foreign spell, as stored."""
    rows = conn.execute("SELECT * FROM outbox WHERE foreign_id=? ORDER BY id", (spell_id,))
    return [dict(r) for r in rows.fetchall()]

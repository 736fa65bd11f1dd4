"""GPU processes iadeep did not start that held a GPU idle (``steps/foreign.py``): one row a
spell. The messages owed to the lab's admins about them wait in the one outbox
(``outbox.enqueue_spell``), with the jobs' notifications.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True)
class Spell:
    """A foreign process that held GPU ``node:gpu`` idle from ``since`` (ended_at: None while
    it still does)."""

    id: int
    node: str
    gpu: int
    pid: int
    name: str
    mib: float | None
    since: float
    marked_at: float
    ended_at: float | None = None


def _spell(r: sqlite3.Row) -> Spell:
    return Spell(r["id"], r["node"], r["gpu"], r["pid"], r["name"], r["mib"], r["since"],
                 r["marked_at"], r["ended_at"])


def add(conn: sqlite3.Connection, node: str, gpu: int, pid: int, name: str,
        mib: float | None, since: float, now: float) -> int:
    cur = conn.execute("INSERT INTO foreign_idle (node, gpu, pid, name, mib, since, marked_at) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (node, gpu, pid, name, mib, since, now))
    return int(cur.lastrowid or 0)


def end(conn: sqlite3.Connection, spell_id: int, now: float) -> None:
    conn.execute("UPDATE foreign_idle SET ended_at=? WHERE id=? AND ended_at IS NULL",
                 (now, spell_id))


def get(conn: sqlite3.Connection, spell_id: int) -> Spell:
    return _spell(conn.execute("SELECT * FROM foreign_idle WHERE id=?", (spell_id,)).fetchone())


def open_spells(conn: sqlite3.Connection) -> list[Spell]:
    """The spells not over yet, by node and GPU."""
    rows = conn.execute("SELECT * FROM foreign_idle WHERE ended_at IS NULL "
                        "ORDER BY node, gpu, pid").fetchall()
    return [_spell(r) for r in rows]

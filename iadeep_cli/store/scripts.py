"""The controller's copies of submitted scripts (``<state>/scripts/<id>/``): who owns each, how
big it is, and when it was freed. A job has its own copy; an array has one, under its id (the
first task's), that every task and a task's rerun use.

One member's copies are bounded (``COPIES_PER_USER``, ``BYTES_PER_USER``: a copy counts at
least one file system block), and so are everyone's together (``lab.script_copies_gib``, 1 GiB
by default: two members at their own limits must not fill the state directory everyone's jobs
depend on), so that submitting huge scripts or very many cannot fill it. A copy is freed once
no job using it is unfinished and the last of them ended ``job_dir_retention`` ago (as their
directories on the nodes), or ``PRESSED_RETENTION_S`` ago once the copies together pass half
the lab's total (``retention``).
"""
from __future__ import annotations

import sqlite3

from ..errors import InputError
from ..jobs import FINISHED
from .jobrows import ARRAY_ID

COPIES_PER_USER = 5000            # unfreed copies one member may have
BYTES_PER_USER = 256 * 1024 ** 2  # their size together
BLOCK = 4096                      # what the smallest copy costs on disk
PRESSED_RETENTION_S = 86400.0     # a finished job's copy kept this long when space runs short


def cost(size: int) -> int:
    return max(int(size), BLOCK)


def usage(conn: sqlite3.Connection, owner: str) -> tuple[int, int]:
    """(copies, bytes as counted) of ``owner``'s unfreed copies."""
    row = conn.execute("SELECT COUNT(*), COALESCE(SUM(MAX(bytes, ?)), 0) FROM script_copies "
                       "WHERE owner=? AND freed_at IS NULL", (BLOCK, owner)).fetchone()
    return int(row[0]), int(row[1])


def total(conn: sqlite3.Connection) -> tuple[int, list[tuple[str, int]]]:
    """(bytes as counted of every unfreed copy, the three members holding most with theirs)."""
    rows = conn.execute("SELECT owner, SUM(MAX(bytes, ?)) AS used FROM script_copies "
                        "WHERE freed_at IS NULL GROUP BY owner ORDER BY used DESC, owner",
                        (BLOCK,)).fetchall()
    return sum(int(r[1]) for r in rows), [(str(r[0]), int(r[1])) for r in rows[:3]]


def retention(conn: sqlite3.Connection, retention_s: float, lab_bytes: int) -> float:
    """How long after their jobs ended copies are kept now: ``retention_s``, or at most
    ``PRESSED_RETENTION_S`` while the copies together hold over half of ``lab_bytes``."""
    used, _ = total(conn)
    return min(retention_s, PRESSED_RETENTION_S) if used > lab_bytes // 2 else retention_s


def record(conn: sqlite3.Connection, job_id: int, owner: str, size: int, now: float) -> None:
    conn.execute("INSERT OR REPLACE INTO script_copies (job_id, owner, bytes, created_at) "
                 "VALUES (?, ?, ?, ?)", (job_id, owner, int(size), now))


def freeable(conn: sqlite3.Connection, cutoff: float, limit: int = 500) -> list[int]:
    """Copies whose jobs (the job, or every task of the array, a task's rerun included) all
    ended at ``cutoff`` or before. (A job's rerun takes a copy of its own at submission.)"""
    done = ", ".join(f"'{s.value}'" for s in FINISHED)
    rows = conn.execute(
        "SELECT c.job_id FROM script_copies c WHERE c.freed_at IS NULL AND NOT EXISTS ("
        f"SELECT 1 FROM jobs j WHERE (j.id = c.job_id OR {ARRAY_ID} = c.job_id) "
        f"AND (j.state NOT IN ({done}) OR COALESCE(j.ended_at, 0) > ?)) "
        "ORDER BY c.job_id LIMIT ?", (cutoff, limit)).fetchall()
    return [r[0] for r in rows]


def freed(conn: sqlite3.Connection, job_ids: list[int], now: float) -> None:
    conn.executemany("UPDATE script_copies SET freed_at=? WHERE job_id=?",
                     [(now, i) for i in job_ids])


def admit(conn: sqlite3.Connection, job_id: int, owner: str, size: int, now: float,
          lab_bytes: int | None = None) -> None:
    """Record job ``job_id``'s new copy of ``size`` bytes, or refuse it (InputError, in the
    submission's transaction: nothing of the job stays) when ``owner``'s copies are at their
    limit, or everyone's together at ``lab_bytes`` (``lab.script_copies_gib``)."""
    count, used = usage(conn, owner)
    if count + 1 > COPIES_PER_USER or used + cost(size) > BYTES_PER_USER:
        raise InputError(
            f"{owner} has {count} script copies ({used / 2**20:.1f} MiB) kept by the controller, "
            f"the most one member may have is {COPIES_PER_USER} and "
            f"{BYTES_PER_USER // 2**20} MiB: this script ({size / 2**20:.1f} MiB) is refused",
            hint="a finished job's copy is freed once lab.job_dir_retention has passed; submit "
                 "many runs of one script as an array (--array: one copy for all its tasks)")
    if lab_bytes is not None:
        used_all, most = total(conn)
        if used_all + cost(size) > lab_bytes:
            holders = ", ".join(f"{who} {b / 2**20:.1f} MiB" for who, b in most)
            raise InputError(
                f"the lab's script copies kept by the controller hold {used_all / 2**20:.1f} MiB "
                f"of at most {lab_bytes / 2**20:.0f} MiB (lab.script_copies_gib; most: "
                f"{holders}): this script ({size / 2**20:.1f} MiB) is refused",
                hint="finished jobs' copies are freed a day after they end while space is "
                     "short; ask a lab admin to raise lab.script_copies_gib if the disk has room")
    record(conn, job_id, owner, size, now)

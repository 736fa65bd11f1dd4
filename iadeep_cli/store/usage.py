"""What fair share needs from the database: the moves of jobs into and out of holding GPUs.

The events table is the record of what ran (every transition is one row, written in the same
transaction as the job's state), so usage is read from it and from nothing the controller keeps
in memory: a restarted controller rebuilds the same figures. ``history`` sums the whole record
in SQLite once, at the controller's first round (one pass over the events; Python never sees
one row per event: on a busy year, 440,000 events, that took 6 s, see
benchmarks/bench_fairshare.py); ``moves_after`` then returns only the events since a cursor, so
each later round pays for the few moves since the last one, through the events' primary key.
The decay arithmetic around these sums is ``scheduler.fairshare.UsageLedger``'s.
"""
from __future__ import annotations

import math
import sqlite3

_HELD = "('starting', 'running')"
# Only the moves that begin or end holding GPUs: starting -> running, queued -> held and the
# like change nothing. The job's GPUs are its --gpus (a placement always gives it that many).
_MOVES = f"""
SELECT e.id, e.job_id, j.owner, j.gpus, e.at, e.old_state, e.new_state
FROM events e JOIN jobs j ON j.id = e.job_id
WHERE e.id > ? AND (COALESCE(e.old_state, '') IN {_HELD}) != (e.new_state IN {_HELD})
ORDER BY e.id
"""


# Per owner, every boundary move weighted by 2^((at - ref)/half-life): + for a move out of
# holding GPUs, - for a move in. A finished interval [a, b] sums to w(b) - w(a), which
# UsageLedger.restore turns into its decayed GPU-seconds; a job holding GPUs now has only its
# start's negative term, which restore cancels (it is an open interval).
_SUMS = f"""
SELECT j.owner, SUM(j.gpus * pow(2.0, (e.at - :ref) / :half_life)
                    * CASE WHEN e.new_state IN {_HELD} THEN -1 ELSE 1 END)
FROM events e JOIN jobs j ON j.id = e.job_id
WHERE e.id <= :cursor AND (COALESCE(e.old_state, '') IN {_HELD}) != (e.new_state IN {_HELD})
GROUP BY j.owner
"""
# Jobs holding GPUs now, since their last move into holding them.
_OPEN = f"""
SELECT j.id, j.owner, j.gpus, MAX(e.at)
FROM jobs j JOIN events e ON e.job_id = j.id
WHERE j.state IN {_HELD} AND e.id <= :cursor AND e.new_state IN {_HELD}
      AND COALESCE(e.old_state, '') NOT IN {_HELD}
GROUP BY j.id
"""


def history(conn: sqlite3.Connection, ref: float, half_life_s: float
            ) -> tuple[int, dict[str, float], list[tuple[int, str, float, float]]]:
    """Everything recorded so far, for ``UsageLedger.restore``: the newest event's id (the
    cursor), per owner the sum of the weighted moves (see _SUMS), and the jobs holding GPUs
    now (job id, owner, GPUs, since)."""
    _ensure_pow(conn)
    cursor = int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])
    args = {"ref": ref, "half_life": half_life_s, "cursor": cursor}
    sums = {r[0]: float(r[1] or 0.0) for r in conn.execute(_SUMS, args)}
    held = [(r[0], r[1], float(r[2]), r[3]) for r in conn.execute(_OPEN, args)]
    return cursor, sums, held


def _ensure_pow(conn: sqlite3.Connection) -> None:
    """SQLite's pow() exists only where it was built with its math functions (Python's own
    builds are; some distributions' are not): define it on this connection where missing."""
    try:
        conn.execute("SELECT pow(2.0, 1.0)").fetchone()
    except sqlite3.OperationalError:
        conn.create_function("pow", 2, math.pow, deterministic=True)


def moves_after(conn: sqlite3.Connection, cursor: int
                ) -> list[tuple[int, int, str, float, float, str | None, str]]:
    """(event id, job id, owner, GPUs, at, old state, new state) of every event after
    ``cursor`` that starts or ends a job's holding of GPUs, oldest first."""
    return [(r[0], r[1], r[2], float(r[3]), r[4], r[5], r[6])
            for r in conn.execute(_MOVES, (cursor,))]



def owners_with_jobs(conn: sqlite3.Connection) -> set[str]:
    """Users with a job waiting (queued or held) or holding GPUs now: they count for fair
    share's shares even before they used anything."""
    return {r[0] for r in conn.execute(
        "SELECT DISTINCT owner FROM jobs WHERE state IN "
        "('queued', 'held', 'starting', 'running')")}

"""What fair share needs from the database: the moves of jobs into and out of holding GPUs.

The events table is the record of what ran (every transition is one row, written in the same
transaction as the job's state), so usage is read from it and from nothing the controller keeps
in memory: a restarted controller rebuilds the same figures. ``moves_after`` returns only the
events since a cursor, so the controller's ``UsageLedger`` (``scheduler.fairshare``) pays once
at start for the history and then, each round, for the few moves since the last one, through
the events' primary key.
"""
from __future__ import annotations

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

"""Accounting over the recorded jobs (``iadeep report``): who used the GPUs, how long jobs
waited, how fast they ran while sharing.

Everything is computed from the database the controller writes: the jobs table for what a
job is (owner, workload, node, GPUs, final state, last speeds) and the events table for when it
held GPUs. The events are needed because a requeued job's ``started_at`` is only its *last*
attempt's start: its earlier attempts used GPUs too, and its queue wait ends at its *first*
start. SQLite does all the work (one row per job into a temporary table, then an aggregate per
group and two ranks per percentile): Python never sees one row per job, which on 100,000 jobs
costs more than the queries themselves (benchmarks/bench_report.py).

Definitions (the README repeats them):

- **in the window**: a finished job (succeeded, failed, cancelled, timeout) whose ``ended_at``
  is in [since, until). With ``running``, also jobs starting or running now that started
  before ``until``. A job is counted whole in the window it ended in, as ``sacct`` does.
- **GPU-hours**: the job's GPUs times the time it spent ``starting`` or ``running``, summed
  over all its attempts (from each move into ``starting`` to the next move). Time ``lost`` (its
  node silent: the controller cannot know whether it ran) is not counted. A running job
  counts up to ``now``.
- **queue wait**: from submission to its first move into ``starting`` (held time and waiting
  for dependencies included); jobs that never started have none.
- **speeds**: the job's last recorded predicted and observed speed (1.00 = as fast as alone),
  averaged over the jobs that have one.
"""
from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..jobs import ACTIVE, FINISHED, JobState

GROUPINGS = ("user", "workload", "node", "day")
# The SQL expression each grouping reads; "day" is the local day the job ended (now if running).
_GROUP_KEY = {None: "'total'", "user": "owner", "workload": "COALESCE(workload, '-')",
              "node": "COALESCE(node, '-')",
              "day": "date(COALESCE(ended_at, :now), 'unixepoch', 'localtime')"}
# Final states first, in the order the table shows them, then the unfinished ones --running adds.
STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
          JobState.STARTING, JobState.RUNNING)
_HELD = "('starting', 'running')"

# One row per job in the window, in a temporary table (the connection may be read-only; TEMP
# lives apart from the database): the group key, GPUs, seconds holding GPUs and queue wait.
# Held time without a window function: each move INTO starting/running subtracts its time and
# each move OUT OF them adds its time, so a job's sum is the time it spent there (plus now if it
# is there still). This is one aggregate per job over the events_job index; LEAD() over the
# same events took five times as long on 100,000 jobs. A job without events (a database edited
# by hand) falls back to its last attempt.
_PER_JOB = """
CREATE TEMP TABLE report_jobs AS
WITH sel AS (
    SELECT id, {key} AS key, gpus, state, submitted_at, started_at, ended_at,
           predicted_speed, observed_speed
    FROM jobs
    WHERE ((+state IN ({finished}) AND ended_at >= :since AND ended_at < :until)
           OR (:running AND +state IN ({active}) AND started_at < :until)) {owner}
), per AS (
    SELECT sel.*,
        (SELECT SUM(CASE WHEN e.old_state IN {held} THEN e.at ELSE 0 END)
              - SUM(CASE WHEN e.new_state IN {held} THEN e.at ELSE 0 END)
         FROM events e WHERE e.job_id = sel.id) AS span,
        (SELECT MIN(e.at) FROM events e WHERE e.job_id = sel.id AND e.new_state = 'starting')
            AS first_start
    FROM sel
)
SELECT key, gpus, state, predicted_speed, observed_speed,
       COALESCE(span + CASE WHEN state IN {held} THEN :now ELSE 0 END,
                COALESCE(ended_at, :now) - started_at, 0) AS held_s,
       COALESCE(first_start, started_at) - submitted_at AS wait_s
FROM per
"""
_FIGURES = """
SELECT {key} AS key, COUNT(*) AS jobs, {states}, SUM(gpus * held_s) / 3600.0 AS gpu_hours,
       AVG(predicted_speed) AS predicted_speed, COUNT(predicted_speed) AS with_predicted,
       AVG(observed_speed) AS observed_speed, COUNT(observed_speed) AS with_observed
FROM temp.report_jobs GROUP BY 1 ORDER BY 1
"""
# The waits a group's p50 and p95 interpolate between, by rank, read off an index on the
# temporary table (a window function over all the waits sorted them twice: slower).
_WAIT_AT = """
SELECT wait_s FROM temp.report_jobs WHERE key = :key AND wait_s IS NOT NULL
ORDER BY wait_s LIMIT 2 OFFSET :rank
"""


@dataclass
class Group:
    """One line of the report: the jobs of one user, workload, node or day (or all of them)."""

    key: str
    jobs: int = 0
    states: dict[str, int] = field(default_factory=dict)
    gpu_hours: float = 0.0
    wait_p50_s: float | None = None
    wait_p95_s: float | None = None
    predicted_speed: float | None = None   # mean over the jobs that have one
    observed_speed: float | None = None
    with_predicted: int = 0                # how many jobs those means are over
    with_observed: int = 0

    def to_dict(self) -> dict:
        return {"key": self.key, "jobs": self.jobs,
                "states": {s.value: self.states.get(s.value, 0) for s in STATES
                           if s.value in self.states or s in FINISHED},
                "gpu_hours": round(self.gpu_hours, 4),
                "wait_p50_s": _round(self.wait_p50_s), "wait_p95_s": _round(self.wait_p95_s),
                "predicted_speed": _round(self.predicted_speed),
                "observed_speed": _round(self.observed_speed),
                "jobs_with_predicted_speed": self.with_predicted,
                "jobs_with_observed_speed": self.with_observed}


@dataclass(frozen=True)
class Report:
    since: float
    until: float
    now: float
    by: str | None
    running: bool
    groups: tuple[Group, ...]
    total: Group


def percentile(ordered: Sequence[float], pct: float) -> float | None:
    """The ``pct`` percentile of sorted values, interpolated linearly between the two nearest
    ranks (numpy's default, so a reader can check it by hand); None for no values."""
    if not ordered:
        return None
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _round(x: float | None) -> float | None:
    """To 4 decimals in JSON and CSV (a tenth of a millisecond, a speed's 0.01%)."""
    return None if x is None else round(x, 4)


def report(conn: sqlite3.Connection, since: float, until: float, *, by: str | None = None,
           user: str | None = None, running: bool = False, now: float | None = None) -> Report:
    """The report over [since, until) (see the module's definitions), grouped ``by`` one of
    GROUPINGS (None: only the total), for one ``user`` or everyone."""
    if by is not None and by not in GROUPINGS:
        raise ValueError(f"not a grouping: {by!r}")
    now = time.time() if now is None else now
    params = {"since": since, "until": until, "running": int(running), "now": now,
              "user": user}
    conn.execute("PRAGMA temp_store = MEMORY")   # no temporary file in the reader's TMPDIR
    conn.execute("DROP TABLE IF EXISTS temp.report_jobs")
    conn.execute(_PER_JOB.format(key=_GROUP_KEY[by], finished=_quoted(FINISHED),
                                 active=_quoted(ACTIVE), held=_HELD,
                                 owner="AND owner = :user" if user is not None else ""),
                 params)
    conn.execute("CREATE INDEX temp.report_jobs_key ON report_jobs(key, wait_s)")
    try:
        groups = _groups(conn, "key") if by is not None else []
        total = _groups(conn, "'total'") or [Group("total")]
    finally:
        conn.execute("DROP TABLE IF EXISTS temp.report_jobs")
    return Report(since=since, until=until, now=now, by=by, running=running,
                  groups=tuple(groups), total=total[0])


def _groups(conn: sqlite3.Connection, key: str) -> list[Group]:
    """The figures per value of ``key`` (an SQL expression over temp.report_jobs)."""
    states = ", ".join(f"SUM(state = '{s.value}') AS \"{s.value}\"" for s in STATES)
    groups = {}
    for row in conn.execute(_FIGURES.format(key=key, states=states)):
        groups[row["key"]] = Group(
            key=row["key"], jobs=row["jobs"],
            states={s.value: row[s.value] for s in STATES if row[s.value]},
            gpu_hours=row["gpu_hours"] or 0.0, predicted_speed=row["predicted_speed"],
            observed_speed=row["observed_speed"], with_predicted=row["with_predicted"],
            with_observed=row["with_observed"])
    counts = conn.execute(f"SELECT {key} AS key, COUNT(wait_s) AS n FROM temp.report_jobs "
                          "GROUP BY 1")
    for row in counts.fetchall():
        if row["n"]:
            group = groups[row["key"]]
            group.wait_p50_s = _wait_percentile(conn, key, row["key"], row["n"], 50)
            group.wait_p95_s = _wait_percentile(conn, key, row["key"], row["n"], 95)
    return list(groups.values())


def _wait_percentile(conn: sqlite3.Connection, key: str, value: str, n: int, pct: int
                     ) -> float:
    """``percentile`` of a group's ``n`` waits, reading only the two ranks it needs."""
    low = (n - 1) * pct // 100
    sql = _WAIT_AT if key == "key" else _WAIT_AT.replace("key = :key AND ", "")
    at = [r[0] for r in conn.execute(sql, {"key": value, "rank": low})]
    return at[0] + (at[-1] - at[0]) * ((n - 1) * pct / 100 - low)


def _quoted(states: Iterable[JobState]) -> str:
    """States as SQL literals (our own enum values, never user input)."""
    return ", ".join(f"'{s.value}'" for s in sorted(states, key=lambda s: s.value))

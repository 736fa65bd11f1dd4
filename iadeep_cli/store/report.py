"""Accounting over the recorded jobs (``iadeep report``): who used the GPUs, how long jobs
waited, how fast they ran while sharing.

Everything is computed from the database the controller writes: the jobs table for what a
job is (owner, workload, node, GPUs, final state, last speeds) and the events table for when it
held GPUs. The events are needed because a requeued job's ``started_at`` is only its *last*
attempt's start: its earlier attempts used GPUs too, and its queue wait ends at its *first*
start. One SQL statement does the per-job part (a window over each job's events), so a year of
a busy lab is one pass over the database; Python only groups and takes percentiles.

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
# Column each grouping reads from the per-job query below ("day" is computed from a time).
_GROUP_COLUMN = {"user": "owner", "workload": "workload", "node": "node"}
# Final states first, in the order the table shows them, then the unfinished ones --running adds.
STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
          JobState.STARTING, JobState.RUNNING)

# Per job: its row's facts, the seconds it held GPUs over all attempts, its first start.
# LEAD gives each event the time of the job's next event: the end of the state it entered.
_PER_JOB = """
WITH sel AS (
    SELECT id, owner, workload, node, gpus, state, submitted_at, started_at, ended_at,
           predicted_speed, observed_speed
    FROM jobs
    WHERE (state IN ({finished}) AND ended_at >= :since AND ended_at < :until)
       OR (:running AND state IN ({active}) AND started_at < :until)
),
ev AS (
    SELECT e.job_id, e.at, e.new_state,
           LEAD(e.at) OVER (PARTITION BY e.job_id ORDER BY e.id) AS next_at
    FROM events e JOIN sel ON sel.id = e.job_id
),
per AS (
    SELECT job_id,
           SUM(CASE WHEN new_state IN ('starting', 'running')
                    THEN COALESCE(next_at, :now) - at ELSE 0 END) AS held_s,
           MIN(CASE WHEN new_state = 'starting' THEN at END) AS first_start
    FROM ev GROUP BY job_id
)
SELECT sel.*, per.held_s, per.first_start
FROM sel LEFT JOIN per ON per.job_id = sel.id
{owner}
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
    _waits: list[float] = field(default_factory=list, repr=False)
    _predicted: list[float] = field(default_factory=list, repr=False)
    _observed: list[float] = field(default_factory=list, repr=False)

    def add(self, row: sqlite3.Row, held_s: float, wait_s: float | None) -> None:
        self.jobs += 1
        self.states[row["state"]] = self.states.get(row["state"], 0) + 1
        self.gpu_hours += row["gpus"] * held_s / 3600.0
        if wait_s is not None:
            self._waits.append(wait_s)
        if row["predicted_speed"] is not None:
            self._predicted.append(row["predicted_speed"])
        if row["observed_speed"] is not None:
            self._observed.append(row["observed_speed"])

    def finish(self) -> Group:
        """Turn the collected samples into the figures (percentiles, means)."""
        waits = sorted(self._waits)
        self.wait_p50_s, self.wait_p95_s = percentile(waits, 50), percentile(waits, 95)
        self.with_predicted, self.with_observed = len(self._predicted), len(self._observed)
        self.predicted_speed = _mean(self._predicted)
        self.observed_speed = _mean(self._observed)
        return self

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


def _day(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(ts))


def report(conn: sqlite3.Connection, since: float, until: float, *, by: str | None = None,
           user: str | None = None, running: bool = False, now: float | None = None) -> Report:
    """The report over [since, until) (see the module's definitions), grouped ``by`` one of
    GROUPINGS (None: only the total), for one ``user`` or everyone."""
    if by is not None and by not in GROUPINGS:
        raise ValueError(f"not a grouping: {by!r}")
    now = time.time() if now is None else now
    sql = _PER_JOB.format(finished=_quoted(FINISHED), active=_quoted(ACTIVE),
                          owner="WHERE sel.owner = :user" if user is not None else "")
    rows = conn.execute(sql, {"since": since, "until": until, "running": int(running),
                              "now": now, "user": user})
    groups: dict[str, Group] = {}
    total = Group("total")
    for row in rows:
        held_s = row["held_s"]
        if held_s is None:   # no events (a database edited by hand): the last attempt only
            start, end = row["started_at"], row["ended_at"] or now
            held_s = end - start if start is not None else 0.0
        first = row["first_start"] if row["first_start"] is not None else row["started_at"]
        wait_s = first - row["submitted_at"] if first is not None else None
        total.add(row, held_s, wait_s)
        if by is not None:
            key = (_day(row["ended_at"] if row["ended_at"] is not None else now) if by == "day"
                   else row[_GROUP_COLUMN[by]] or "-")
            groups.setdefault(key, Group(key)).add(row, held_s, wait_s)
    ordered = tuple(groups[k].finish() for k in sorted(groups))
    return Report(since=since, until=until, now=now, by=by, running=running, groups=ordered,
                  total=total.finish())


def _quoted(states: Iterable[JobState]) -> str:
    """States as SQL literals (our own enum values, never user input)."""
    return ", ".join(f"'{s.value}'" for s in sorted(states, key=lambda s: s.value))

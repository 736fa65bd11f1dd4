"""Accounting over the recorded jobs (``iadeep report``): who used the GPUs, how long jobs
waited, how fast they ran while sharing.

Everything is read off the jobs table the controller writes: what a job is (owner, workload,
node, GPUs, final state, last speeds) and what the transitions and polls keep on its row: the
time it held GPUs over *all* its attempts and its *first* start (a requeued job's
``started_at`` is only its last attempt's; its earlier attempts used GPUs too, and its queue
wait ends at its first start), and its work, busy share, sharing and energy (store/impact.py).
So the report is one GROUP BY over the jobs in the window and one sort of their waits, never a
pass over the events; Python sees one line per group and state, never one per job
(benchmarks/bench_report.py).

Definitions (docs/accounting.md repeats them):

- **in the window**: a finished job (succeeded, failed, cancelled, timeout) whose ``ended_at``
  is in [since, until). With ``running``, also jobs starting or running now that started
  before ``until``. A job is counted whole in the window it ended in, as ``sacct`` does.
- **GPU-hours**: the job's GPUs times the time it spent ``starting`` or ``running``, summed
  over all its attempts (from each move into ``starting`` to the next move). Time ``lost`` (its
  node silent: the controller cannot know whether it ran) is not counted. A running job
  counts up to ``now``.
- **work, busy, saved, impact factor, measured share, energy**: the impact accounting's totals
  (store/impact.py) summed over the group's jobs; **sharing speed**: their work while sharing a
  GPU over their GPU-time sharing (time-weighted: the slowdown sharing cost them).
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
from typing import Any

from ..jobs import ACTIVE, FINISHED, JobState
from . import impact

GROUPINGS = ("user", "workload", "node", "day")
# The SQL expression each grouping reads; "day" is the local day the job ended (now if running).
_GROUP_KEY = {None: "'total'", "user": "owner", "workload": "COALESCE(workload, '-')",
              "node": "COALESCE(node, '-')",
              "day": "date(COALESCE(ended_at, :now), 'unixepoch', 'localtime')"}
# Final states first, in the order the table shows them, then the unfinished ones --running adds.
STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
          JobState.STARTING, JobState.RUNNING)

# Everything is read off the job rows: held time, first start and the impact accounting are
# columns the controller keeps at each transition (store/jobrows._hold_time, store/impact.py), so
# the report never reads the events (on 100,000 jobs that alone took 1.6-2.6 s under load,
# over the 1 s target: benchmarks/bench_report.py). The figures are one pass over the jobs in
# the window (the index on ended_at picks them) with one aggregate line per group; the group
# total is summed from the groups.
# A job's seconds holding GPUs: its row's total, plus the current stretch for a job that
# still holds them (only --running selects such jobs: the plain report adds plain columns).
_HELD_NOW = ("(held_s + CASE WHEN state IN ('starting', 'running') AND held_since IS NOT NULL "
             "THEN MAX(0, :now - held_since) ELSE 0 END)")
_FINISHED_IN = "+state IN ({finished}) AND ended_at >= :since AND ended_at < :until"
# --running: also the active jobs (OR-ing this in only when asked keeps the plain report on the
# ended_at index alone)
_RUNNING_TOO = "(" + _FINISHED_IN + ") OR (state IN ({active}) AND started_at < :until)"
# One line per group. The count per state is a column each (a SUM of a comparison), not a
# GROUP BY on the state: grouping sorts every row with all its figures first, which took as
# long as the sums themselves; the total report has no GROUP BY at all, so no sort.
_FIGURES = """
SELECT {key} AS key, COUNT(*) AS jobs, {per_state},
       SUM(gpus * {held}) / 3600.0 AS gpu_hours,
       SUM(predicted_speed) AS predicted_sum, COUNT(predicted_speed) AS with_predicted,
       SUM(observed_speed) AS observed_sum, COUNT(observed_speed) AS with_observed,
       TOTAL(work_s) AS work_s, TOTAL(measured_s) AS measured_s, TOTAL(busy_s) AS busy_s,
       TOTAL(shared_s) AS shared_s, TOTAL(shared_work_s) AS shared_work_s,
       SUM(energy_j) AS energy_j, group_concat(first_started_at - submitted_at) AS waits
FROM jobs WHERE ({window}) {owner} {group_by}
"""
_PER_STATE = ", ".join(f"SUM(state = '{s.value}') AS n_{s.value}" for s in STATES)
# The queue waits come in the same pass, as one text per group (group_concat skips the jobs that
# never started) that Python splits and sorts at C speed: a second query handing Python one row
# a job took as long as all the figures (ORDER BY into a temporary table, before that, longer).
# SQLite writes each wait to 15 significant digits: far below the report's 4 decimals.


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
    work_gpu_hours: float = 0.0            # exclusive-GPU-hours of work (store/impact.py)
    measured_gpu_hours: float = 0.0        # the part of it done at measured speeds
    busy_gpu_hours: float = 0.0            # these jobs' share of the busy GPUs' time
    sharing_gpu_hours: float = 0.0         # GPU-hours they ran sharing a GPU
    sharing_speed: float | None = None     # their mean speed while sharing (time-weighted)
    energy_kwh: float | None = None        # None: no poll saw their GPUs' power

    @property
    def saved_gpu_hours(self) -> float:
        return self.work_gpu_hours - self.busy_gpu_hours

    @property
    def impact_factor(self) -> float | None:
        return impact.impact_factor(self.work_gpu_hours, self.busy_gpu_hours)

    @property
    def measured_share(self) -> float | None:
        return self.measured_gpu_hours / self.work_gpu_hours if self.work_gpu_hours else None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "jobs": self.jobs,
                "states": {s.value: self.states.get(s.value, 0) for s in STATES
                           if s.value in self.states or s in FINISHED},
                "gpu_hours": round(self.gpu_hours, 4),
                "wait_p50_s": _round(self.wait_p50_s), "wait_p95_s": _round(self.wait_p95_s),
                "predicted_speed": _round(self.predicted_speed),
                "observed_speed": _round(self.observed_speed),
                "jobs_with_predicted_speed": self.with_predicted,
                "jobs_with_observed_speed": self.with_observed,
                # hours and kWh to 6 decimals: 3.6 ms, 1 mWh (a short job's figures, checkable)
                "work_gpu_hours": round(self.work_gpu_hours, 6),
                "busy_gpu_hours": round(self.busy_gpu_hours, 6),
                "saved_gpu_hours": round(self.saved_gpu_hours, 6),
                "impact_factor": _round(self.impact_factor),
                "measured_share": _round(self.measured_share),
                "sharing_gpu_hours": round(self.sharing_gpu_hours, 6),
                "sharing_speed": _round(self.sharing_speed),
                "energy_kwh": None if self.energy_kwh is None else round(self.energy_kwh, 6)}


@dataclass(frozen=True)
class Report:
    since: float
    until: float
    now: float
    by: str | None
    running: bool
    groups: tuple[Group, ...]
    total: Group


def report_to_dict(rep: Report) -> dict[str, Any]:
    """The report as `iadeep report --json` prints it (and the controller sends it)."""
    return {"since": rep.since, "until": rep.until, "now": rep.now, "by": rep.by,
            "running_included": rep.running,
            "groups": [g.to_dict() for g in rep.groups], "total": rep.total.to_dict()}


def report_from_dict(d: dict[str, Any]) -> Report:
    """``report_to_dict``'s inverse (figures as rounded there)."""
    def group(g: dict[str, Any]) -> Group:
        work = g["work_gpu_hours"]
        return Group(key=g["key"], jobs=g["jobs"], states=dict(g["states"]),
                     gpu_hours=g["gpu_hours"], wait_p50_s=g["wait_p50_s"],
                     wait_p95_s=g["wait_p95_s"], predicted_speed=g["predicted_speed"],
                     observed_speed=g["observed_speed"],
                     with_predicted=g["jobs_with_predicted_speed"],
                     with_observed=g["jobs_with_observed_speed"], work_gpu_hours=work,
                     measured_gpu_hours=(g["measured_share"] or 0.0) * work,
                     busy_gpu_hours=g["busy_gpu_hours"],
                     sharing_gpu_hours=g["sharing_gpu_hours"], sharing_speed=g["sharing_speed"],
                     energy_kwh=g["energy_kwh"])
    return Report(since=d["since"], until=d["until"], now=d["now"], by=d["by"],
                  running=d["running_included"], groups=tuple(group(g) for g in d["groups"]),
                  total=group(d["total"]))


def percentile(ordered: Sequence[float], pct: float) -> float | None:
    """The ``pct`` percentile of sorted values, interpolated linearly between the two nearest
    ranks (numpy's default, so a reader can check it by hand); None for no values."""
    if not ordered:
        return None
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


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
    params = {"since": since, "until": until, "now": now, "user": user}
    conn.execute("PRAGMA temp_store = MEMORY")   # a GROUP BY's sort: no file in the TMPDIR
    where = (_RUNNING_TOO if running else _FINISHED_IN).format(
        finished=_quoted(FINISHED), active=_quoted(ACTIVE))
    owner = "AND owner = :user" if user is not None else ""
    key = _GROUP_KEY[by]
    lines = conn.execute(_FIGURES.format(
        key=key, per_state=_PER_STATE, held=_HELD_NOW if running else "held_s", window=where,
        owner=owner, group_by="" if by is None else "GROUP BY 1"), params).fetchall()
    rows = sorted((row for row in lines if row["jobs"]), key=lambda row: row["key"])
    groups = [_group(row) for row in rows]
    waits = [sorted(map(float, row["waits"].split(","))) if row["waits"] else [] for row in rows]
    for group, ordered in zip(groups, waits):
        group.wait_p50_s, group.wait_p95_s = percentile(ordered, 50), percentile(ordered, 95)
    total = _sum(groups)
    if by is None and groups:
        total.wait_p50_s, total.wait_p95_s = groups[0].wait_p50_s, groups[0].wait_p95_s
    else:
        every = sorted(w for ordered in waits for w in ordered)
        total.wait_p50_s, total.wait_p95_s = percentile(every, 50), percentile(every, 95)
    return Report(since=since, until=until, now=now, by=by, running=running,
                  groups=tuple(groups) if by is not None else (), total=total)


def _group(row: sqlite3.Row) -> Group:
    """A group's figures from its aggregate line."""
    def mean(column: str, n: str) -> float | None:
        return row[column] / row[n] if row[n] else None

    shared_s = row["shared_s"]
    return Group(
        key=row["key"], jobs=row["jobs"],
        states={s.value: row[f"n_{s.value}"] for s in STATES if row[f"n_{s.value}"]},
        gpu_hours=row["gpu_hours"] or 0.0,
        predicted_speed=mean("predicted_sum", "with_predicted"),
        observed_speed=mean("observed_sum", "with_observed"),
        with_predicted=row["with_predicted"], with_observed=row["with_observed"],
        work_gpu_hours=row["work_s"] / 3600, measured_gpu_hours=row["measured_s"] / 3600,
        busy_gpu_hours=row["busy_s"] / 3600, sharing_gpu_hours=shared_s / 3600,
        sharing_speed=row["shared_work_s"] / shared_s if shared_s else None,
        energy_kwh=None if row["energy_j"] is None else row["energy_j"] / 3.6e6)


def _sum(groups: list[Group]) -> Group:
    """All the groups together (sums add up; means are weighted by how many jobs have one)."""
    total = Group("total")
    sharing_work = 0.0
    for g in groups:
        total.jobs += g.jobs
        for state, n in g.states.items():
            total.states[state] = total.states.get(state, 0) + n
        total.gpu_hours += g.gpu_hours
        total.work_gpu_hours += g.work_gpu_hours
        total.measured_gpu_hours += g.measured_gpu_hours
        total.busy_gpu_hours += g.busy_gpu_hours
        total.sharing_gpu_hours += g.sharing_gpu_hours
        sharing_work += (g.sharing_speed or 0.0) * g.sharing_gpu_hours
        if g.energy_kwh is not None:
            total.energy_kwh = (total.energy_kwh or 0.0) + g.energy_kwh
    total.predicted_speed = _weighted([(g.predicted_speed, g.with_predicted) for g in groups])
    total.observed_speed = _weighted([(g.observed_speed, g.with_observed) for g in groups])
    total.with_predicted = sum(g.with_predicted for g in groups)
    total.with_observed = sum(g.with_observed for g in groups)
    if total.sharing_gpu_hours:
        total.sharing_speed = sharing_work / total.sharing_gpu_hours
    return total


def _weighted(means: list[tuple[float | None, int]]) -> float | None:
    n = sum(count for mean, count in means if mean is not None)
    return sum(mean * count for mean, count in means if mean is not None) / n if n else None


def _quoted(states: Iterable[JobState]) -> str:
    """States as SQL literals (our own enum values, never user input)."""
    return ", ".join(f"'{s.value}'" for s in sorted(states, key=lambda s: s.value))

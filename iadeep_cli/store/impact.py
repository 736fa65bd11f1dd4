"""The impact of sharing, measured: work done in exclusive-GPU-hours against the GPU-hours the
busy GPUs were busy. The one place it is recorded and computed; `iadeep status`, the monitor,
`iadeep report` (and the metrics) all read it from here.

Definitions (docs/accounting.md repeats them):

- A GPU is **busy** while at least one iadeep job *runs* on it (``running``; not ``starting``,
  not ``lost``). **Busy GPU-seconds** are shared out among the jobs on it: a job on a GPU with
  n running jobs is charged 1/n of each second, so the charges add up to the busy time.
- A running job does **work** at (its speed relative to running alone) x (its GPUs) exclusive
  GPU-seconds per second. Its speed: the speed observed this poll where it reports progress or
  the SM-utilisation proxy exists (**measured**; a poll that could not read it keeps the last
  measured speed while the job's GPUs are shared by as many jobs as then); else 1.00 when it is
  alone on all its GPUs (by definition); else its predicted speed; else 1/n (as if the GPU were
  time-sliced: neutral).
- **Impact factor** over a window = work / busy. 1.00: as good as one job per GPU; 1.30: the busy
  GPUs did 30% more work than exclusive use would have; below 1.00: sharing hurt.
  **Saved GPU-hours** = work - busy. **Measured share** = measured work / work.
- **Energy**: each GPU's board power (nvidia-smi ``power.draw``, NVML) shared out like busy time,
  integrated over time where the poll saw it (a poll that did not reach the node keeps the last
  reading while the GPU's jobs are the same).

How it is recorded, cheaply and durably: each running job carries on its row the *rate* it
accrues at (``acct_rate``: speed, measured?, busy share, sharing?, power) and the time it was
accounted up to (``acct_at``). Every poll (``tick``) and every move into or out of ``running``
(``store.jobrows.transition`` calls ``accrue``/``reprice`` for the GPUs involved) adds rate x
elapsed time to the job's totals (``work_s``, ``measured_s``, ``busy_s``, ``shared_s``,
``shared_work_s``, ``energy_j``) and to a time-bucketed table ``usage`` (one row a minute for
two days, then one an hour), then sets the new rates. So the totals are exact at every
transition (a job's running time is the events' running time, to the second), a poll costs one
UPDATE per running job, and the history grows by one row an hour, not a row per job per poll.
"""
from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..snapshot import ClusterSnapshot

MINUTE, HOUR = 60, 3600
KEEP_MINUTES_S = 2 * 86400   # minute rows older than this are folded into hour rows
GpuKey = tuple[str, int]     # (node, GPU index)


def impact_factor(work_s: float | None, busy_s: float | None) -> float | None:
    """Work over busy time; None when nothing was busy (no ratio to speak of)."""
    if not busy_s or work_s is None:
        return None
    return work_s / busy_s


@dataclass(frozen=True)
class Window:
    """The totals over one time window (seconds: GPU-seconds; joules)."""

    since: float
    until: float
    busy_s: float = 0.0
    work_s: float = 0.0
    measured_s: float = 0.0
    energy_j: float = 0.0

    @property
    def impact_factor(self) -> float | None:
        return impact_factor(self.work_s, self.busy_s)

    @property
    def saved_s(self) -> float:
        return self.work_s - self.busy_s

    @property
    def measured_share(self) -> float | None:
        return self.measured_s / self.work_s if self.work_s > 0 else None


def window(conn: sqlite3.Connection, since: float, until: float) -> Window:
    """The recorded totals of the buckets starting in [since, until) (minute resolution for the
    last two days, hour resolution before)."""
    row = conn.execute(
        "SELECT COALESCE(SUM(busy_s), 0), COALESCE(SUM(work_s), 0), "
        "COALESCE(SUM(measured_s), 0), COALESCE(SUM(energy_j), 0) FROM usage "
        "WHERE span IN (60, 3600) AND start >= ? AND start < ?",
        (_floor(since, MINUTE), until)).fetchone()
    return Window(since, until, *row)


# ------------------------------------------------------------------ recording
@dataclass(frozen=True)
class _Running:
    """A running job's accounting columns, each JSON column decoded once per poll."""

    id: int
    gpus: int
    node: str
    keys: tuple[GpuKey, ...]      # (node, index) of each of its GPUs
    acct_at: float | None
    rate: dict[str, Any] | None   # the rate it accrues at (``acct_rate``)
    predicted_speed: float | None


def _running(conn: sqlite3.Connection) -> list[_Running]:
    return [_Running(row["id"], row["gpus"], row["node"],
                     tuple((row["node"], g) for g in json.loads(row["gpu_indices"])),
                     row["acct_at"], json.loads(row["acct_rate"]) if row["acct_rate"] else None,
                     row["predicted_speed"])
            for row in conn.execute("SELECT id, gpus, node, gpu_indices, acct_at, acct_rate, "
                                    "predicted_speed FROM jobs WHERE state = 'running'")]


def _in(rows: Iterable[_Running], only: Iterable[GpuKey] | None) -> list[_Running]:
    """The rows on any of the GPUs ``only`` (all of them where None)."""
    if only is None:
        return list(rows)
    scope = set(only)
    return [row for row in rows if not scope.isdisjoint(row.keys)]


Buckets = dict[tuple[int, float], list[float]]
# (work, measured, busy, shared, shared work, energy or None): what one accrual adds to a job
Accrual = tuple[float, float, float, float, float, "float | None"]


def _accrual(row: _Running, now: float, buckets: Buckets) -> Accrual | None:
    """What ``row`` accrued from its ``acct_at`` up to ``now`` at its rate (None: nothing to
    accrue: never priced, or already accounted up to now), also spread into ``buckets``."""
    if row.acct_at is None or row.rate is None or now <= row.acct_at:
        return None
    rate, dt = row.rate, now - row.acct_at
    work = rate["speed"] * row.gpus * dt
    busy = rate["busy"] * dt
    measured = work if rate["measured"] else 0.0
    energy = None if rate["power"] is None else rate["power"] * dt
    for key, part in _spread(row.acct_at, now):
        into = buckets[key]
        into[0] += busy * part
        into[1] += work * part
        into[2] += measured * part
        into[3] += (energy or 0.0) * part
    return (work, measured, busy, row.gpus * dt if rate["shared"] else 0.0,
            work if rate["shared"] else 0.0, energy)


_ADD_TOTALS = ("work_s = work_s + ?, measured_s = measured_s + ?, busy_s = busy_s + ?, "
               "shared_s = shared_s + ?, shared_work_s = shared_work_s + ?, "
               "energy_j = CASE WHEN ? IS NULL THEN energy_j ELSE COALESCE(energy_j, 0) + ? END")


def _totals(got: Accrual) -> tuple[Any, ...]:
    """``got`` as the parameters of ``_ADD_TOTALS``."""
    return (*got, got[5])


def _add_buckets(conn: sqlite3.Connection, buckets: Buckets) -> None:
    conn.executemany(
        "INSERT INTO usage (span, start, busy_s, work_s, measured_s, energy_j) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(span, start) DO UPDATE SET "
        "busy_s = busy_s + excluded.busy_s, work_s = work_s + excluded.work_s, "
        "measured_s = measured_s + excluded.measured_s, energy_j = energy_j + excluded.energy_j",
        [(span, start, *v) for (span, start), v in buckets.items()])


def _new_buckets() -> Buckets:
    return defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])


def accrue(conn: sqlite3.Connection, now: float, only: Iterable[GpuKey] | None = None) -> None:
    """Add each running job's rate x the time since it was last accounted, up to ``now`` (only
    the jobs on GPUs ``only``, if given: a transition there changes their rates)."""
    buckets = _new_buckets()
    updates = []
    for row in _in(_running(conn), only):
        got = _accrual(row, now, buckets)
        if got is not None:
            updates.append((*_totals(got), now, row.id))
    conn.executemany(   # one statement for every job: a poll's accounting is per job
        f"UPDATE jobs SET {_ADD_TOTALS}, acct_at = ? WHERE id = ?", updates)
    _add_buckets(conn, buckets)


def _rates(conn: sqlite3.Connection, rows: Sequence[_Running], priced: Sequence[_Running],
           observed: Mapping[int, float], power: Mapping[GpuKey, float] | None
           ) -> dict[int, str]:
    """The rate (JSON) each of ``priced`` accrues at from now on, given how many of ``rows``
    (every running job) share each of its GPUs, this poll's ``observed`` speeds and the GPUs'
    ``power`` draw (None: each node's last recorded poll's)."""
    sharing: dict[GpuKey, int] = defaultdict(int)
    for row in rows:
        for key in row.keys:
            sharing[key] += 1
    if power is None:   # a transition: the nodes concerned, as last polled
        power = last_power(conn, {row.node for row in priced})
    out: dict[int, str] = {}
    for row in priced:
        counts = [sharing[key] for key in row.keys] or [1]
        alone = max(counts) == 1
        before = row.rate or {}
        if row.id in observed:
            speed, measured = float(observed[row.id]), True
        elif before.get("measured") and before.get("n") == counts:
            # measured before, in the same company: a poll that could not read its progress
            # this time (a slow node) leaves its measured speed as it was
            speed, measured = before["speed"], True
        elif alone:
            speed, measured = 1.0, False
        else:
            speed = row.predicted_speed if row.predicted_speed is not None \
                else 1.0 / max(counts)
            measured = False
        busy = sum(1.0 / n for n in counts) if row.keys else float(row.gpus)
        watts = [power[key] / sharing[key] for key in row.keys if power.get(key) is not None]
        if not watts and before.get("power") is not None and before.get("n") == counts:
            watts = [before["power"]]   # this poll did not reach its node: as it drew last
        out[row.id] = json.dumps({"speed": round(speed, 6), "measured": measured, "busy": busy,
                                  "shared": not alone, "power": sum(watts) if watts else None,
                                  "n": counts})
    return out


def reprice(conn: sqlite3.Connection, now: float, *, observed: Mapping[int, float] | None = None,
            power: Mapping[GpuKey, float] | None = None,
            only: Iterable[GpuKey] | None = None) -> None:
    """Set the rate each running job accrues at from now on (only the jobs on GPUs ``only``, if
    given), from how many jobs share each of its GPUs, this poll's ``observed`` speeds and the
    GPUs' ``power`` draw (None: the last recorded poll's). A job accounted for the first time
    (it just started running, or an older controller started it) counts from ``now``."""
    rows = _running(conn)
    rates = _rates(conn, rows, _in(rows, only), observed or {}, power)
    conn.executemany("UPDATE jobs SET acct_rate = ?, acct_at = COALESCE(acct_at, ?) "
                     "WHERE id = ?", [(rate, now, job_id) for job_id, rate in rates.items()])


def tick(conn: sqlite3.Connection, now: float, observed: Mapping[int, float],
         power: Mapping[GpuKey, float]) -> None:
    """One poll's accounting: accrue every running job up to ``now`` and set its rate from this
    poll (one read of the running jobs and one UPDATE each, the two together), and fold minute
    rows older than two days into hour rows."""
    rows = _running(conn)
    buckets = _new_buckets()
    rates = _rates(conn, rows, rows, observed, power)
    updates = []
    for row in rows:
        got = _accrual(row, now, buckets)
        # accrued: accounted up to now; else as it was (first priced: from now)
        at = now if got is not None or row.acct_at is None else row.acct_at
        updates.append((*_totals(got or (0.0, 0.0, 0.0, 0.0, 0.0, None)), rates[row.id], at,
                        row.id))
    conn.executemany(f"UPDATE jobs SET {_ADD_TOTALS}, acct_rate = ?, acct_at = ? WHERE id = ?",
                     updates)
    _add_buckets(conn, buckets)
    compact(conn, now)


def power_of(snapshot: ClusterSnapshot) -> dict[GpuKey, float]:
    """Each GPU's power draw in this poll, where it was read (a failed poll: none)."""
    return {(node.name, gpu.index): gpu.power_draw_w for node in snapshot.nodes if node.ok
            for gpu in node.gpus if gpu.power_draw_w is not None}


def last_power(conn: sqlite3.Connection, nodes: set[str]) -> dict[GpuKey, float]:
    """Each GPU's power draw in its node's last recorded poll (nodes whose poll failed: none)."""
    out: dict[GpuKey, float] = {}
    for node in nodes:
        row = conn.execute("SELECT data FROM node_snapshots WHERE node = ?", (node,)).fetchone()
        if row is None:
            continue
        data = json.loads(row["data"])
        if data.get("error"):
            continue
        for gpu in data.get("gpus", ()):
            if gpu.get("power_draw_w") is not None:
                out[(node, gpu["index"])] = gpu["power_draw_w"]
    return out


def compact(conn: sqlite3.Connection, now: float) -> None:
    """Fold minute rows older than KEEP_MINUTES_S into their hour rows (whole hours only)."""
    cut = _floor(now - KEEP_MINUTES_S, HOUR)
    old = conn.execute("SELECT 1 FROM usage WHERE span = 60 AND start < ? LIMIT 1",
                       (cut,)).fetchone()
    if old is None:
        return
    conn.execute(
        "INSERT INTO usage (span, start, busy_s, work_s, measured_s, energy_j) "
        "SELECT 3600, CAST(start / 3600 AS INTEGER) * 3600.0, SUM(busy_s), SUM(work_s), "
        "SUM(measured_s), SUM(energy_j) FROM usage WHERE span = 60 AND start < ? GROUP BY 2 "
        "ON CONFLICT(span, start) DO UPDATE SET busy_s = busy_s + excluded.busy_s, "
        "work_s = work_s + excluded.work_s, measured_s = measured_s + excluded.measured_s, "
        "energy_j = energy_j + excluded.energy_j", (cut,))
    conn.execute("DELETE FROM usage WHERE span = 60 AND start < ?", (cut,))


def _floor(t: float, span: int) -> float:
    return float(int(t // span) * span)


def _spread(t0: float, t1: float) -> list[tuple[tuple[int, float], float]]:
    """[t0, t1) cut into buckets: ((span, start), the fraction of the interval in it). Minute
    buckets for the last two days before t1, hour buckets before that (a controller down for
    days accounts its jobs' running time when it comes back)."""
    total = t1 - t0
    cut = _floor(t1 - KEEP_MINUTES_S, HOUR)
    out = []
    t = t0
    while t < t1:
        span = HOUR if t < cut else MINUTE
        start = _floor(t, span)
        end = min(t1, start + span, cut if t < cut else t1)
        out.append(((span, start), (end - t) / total))
        t = end
    return out

"""The monitor's view model: controller data in, immutable display rows out. Pure, no Textual.

Keeping this separate from the widgets lets the tests check *what* is shown (ages, queue order,
slowdown levels, filtering) without a terminal, lets the benchmark time it as a baseline, and
lets the widgets skip work when a card's value has not changed (frozen dataclasses compare by
value). Ages are computed from ``taken_at``/``submitted_at`` and an injected ``now``, never from
the clock, so the same data always renders the same screen.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..controller.requests.views import STALE_POLLS
from ..jobs import ACTIVE, JobState
from ..messages import GpuJob, GpuView, JobView, NodeState, NodeView, StatusView
from ..scheduler import priority
from ..settings import Policy
from ..text import clock, column_widths, duration, gpus_at, job_label, moment, newest_runs
from .source import MonitorData

ON_GPUS = ACTIVE | {JobState.LOST}     # shown with where they run (or ran)
# A job's speed is its throughput relative to running alone (1.0 = no slowdown).
SPEED_OK = 0.85
SPEED_WARN = 0.6
DEFAULT_POLL_S = 10.0
# Widths before the first rows are known; then ``fit_widths``: as `queue list` (one
# formatter, ``text.column_widths``), the columns grow and shrink with the terminal. Text
# longer than its column is cut at the column edge.
COLUMNS_WIDTHS = (("#", 4), ("ID", 5), ("USER", 8), ("NAME", 16), ("STATE", 7), ("GPUS", 4),
                  ("AGE", 5), ("REASON / WHERE", 72))
COLUMNS = tuple(label for label, _ in COLUMNS_WIDTHS)
COLUMN_KEYS = ("pos", "id", "user", "name", "state", "gpus", "age", "reason")
# What gives way on a narrow terminal, in order (column, the width it keeps): NAME first, then
# REASON, then USER, then NAME again.
SHRINK = [(3, 16), (7, 30), (2, 8), (3, 8), (7, 12)]
CELL_GAP = 2   # the table's padding between two columns


@dataclass(frozen=True)
class JobChip:
    """A job on a GPU; ``level`` says how much sharing slows it (ok / warn / bad / none)."""

    id: int
    owner: str
    name: str
    predicted: float | None
    observed: float | None
    level: str
    match: bool = True
    idle: bool = False     # its GPUs sat idle past lab.idle_after (controller/round/steps/idle.py)


@dataclass(frozen=True)
class Foreign:
    """A process on a GPU that iadeep did not launch."""

    pid: int
    name: str
    mem_mib: float | None


@dataclass(frozen=True)
class GpuLine:
    index: int
    name: str
    util: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    jobs: tuple[JobChip, ...]
    foreign: tuple[Foreign, ...]
    gone: tuple[int, ...] = ()      # iadeep jobs the GPU last showed that no longer run there
    reserved: str = ""              # "for alice until ...": a reservation holds it (reserve)


@dataclass(frozen=True)
class NodeCard:
    name: str
    up: bool
    error: str | None
    age_s: float
    down_for_s: float | None
    stale: bool
    gpus: tuple[GpuLine, ...]
    visible: bool = True
    drained: str | None = None   # `iadeep nodes drain`: why it takes no new jobs


@dataclass(frozen=True)
class JobRow:
    """One row of the queue table; ``cells`` follow ``COLUMNS``."""

    id: int
    owner: str
    name: str
    state: JobState
    cells: tuple[str, ...]


@dataclass(frozen=True)
class Banner:
    """``live`` (no banner needed), ``stale`` (controller down) or ``never`` (never ran)."""

    level: str
    text: str


@dataclass(frozen=True)
class View:
    banner: Banner
    nodes: tuple[NodeCard, ...]
    rows: tuple[JobRow, ...]
    summary: str
    poll_interval_s: float


# --------------------------------------------------------------------------- small pieces
def speed_level(predicted: float | None, observed: float | None) -> str:
    """Colour class of a job: observed speed when measured, else the prediction."""
    speed = observed if observed is not None else predicted
    if speed is None:
        return "none"
    if speed >= SPEED_OK:
        return "ok"
    return "warn" if speed >= SPEED_WARN else "bad"


def parse_query(query: str) -> tuple[str | None, str]:
    """``user:alice`` or ``@alice`` filters by owner; anything else is free text."""
    q = query.strip()
    for prefix in ("user:", "@"):
        if q.startswith(prefix):
            return q[len(prefix):].strip() or None, ""
    return None, q.lower()


def job_matches(job: JobView | GpuJob, query: str) -> bool:
    owner, text = parse_query(query)
    if owner is not None and job.owner != owner:
        return False
    if not text:
        return True
    where = (job.node, job.reason) if isinstance(job, JobView) else ()
    hay = " ".join(str(v or "") for v in (job.id, job.name, job.owner, job.state, *where))
    return text in hay.lower() or text.lstrip("#") == str(job.id)


def poll_interval(status: StatusView) -> float:
    return min(60.0, max(1.0, float(status.controller.poll_interval_s or DEFAULT_POLL_S)))


# --------------------------------------------------------------------------- banner
def impact_text(status: StatusView) -> str:
    """' · impact 1.24 last hour, 1.18 since start' (store/impact.py); '' with nothing to say."""
    hour, start = status.impact_last_hour, status.impact_since_start
    if hour is None:
        return ""
    parts = [f"{'-' if v.impact_factor is None else f'{v.impact_factor:.2f}'} {label}"
             for v, label in ((hour, "last hour"), (start, "since start")) if v is not None]
    saved = hour.saved_gpu_hours
    return (f" · impact {', '.join(parts)}" + (f" ({saved:+.1f} GPU-h saved in the hour)"
                                                  if hour.impact_factor is not None else ""))


def banner(data: MonitorData, now: float) -> Banner:
    if data.stale_since is None:
        return Banner("live", "controller running; refreshing every "
                              f"{duration(poll_interval(data.status))}"
                              + impact_text(data.status))
    if not data.stale_since:
        return Banner("never", "controller NOT running (it has never run with this state "
                               "directory): start it with `iadeep controller run`")
    age = duration(now - data.stale_since)
    return Banner("stale", f"controller NOT running: last heartbeat {age} ago; showing the "
                           "last recorded state")


# --------------------------------------------------------------------------- cluster cards
def reserved_text(status: StatusView) -> dict[str, str]:
    """GPU name ("node:index") -> what the monitor says of the reservation holding it: ``for
    alice until 17:00`` while its window is open, ``for alice from Dec 10 09:00`` before."""
    out: dict[str, str] = {}
    for r in status.reservations or ():
        moment = (f"until {clock(r.end)}" if r.start <= status.now
                  else f"from {clock(r.start)}")
        for name in r.held:
            out.setdefault(name, f"reserved for {r.user} {moment} (#{r.id})")
    return out


def _gpu_line(gpu: GpuView, query: str, reserved: str = "") -> GpuLine:
    chips = tuple(
        JobChip(j.id, j.owner, j.name, j.predicted_speed, j.observed_speed,
                speed_level(j.predicted_speed, j.observed_speed),
                match=not query or job_matches(j, query), idle=j.idle_since is not None)
        for j in gpu.jobs)
    sample = gpu.sample
    foreign = tuple(Foreign(p.pid, p.name or "", p.used_memory_mib)
                    for p in sample.foreign_processes)
    running = {c.id for c in chips}
    gone = tuple(sorted({p.job_id for p in sample.processes
                         if p.job_id is not None and p.job_id not in running}))
    return GpuLine(sample.index, sample.name or "", sample.utilization_gpu,
                   sample.memory_used_mib, sample.memory_total_mib, chips, foreign, gone,
                   reserved)


def node_card(node: NodeView, now: float, stale_s: float, query: str = "",
              reserved: Mapping[str, str] | None = None) -> NodeCard:
    """A node is up only while its data is younger than ``stale_s`` and the controller still
    polls it (a node removed from the inventory keeps its last snapshot); a node without fresh
    data that was not failing is stale, neither up nor down."""
    gpus = tuple(_gpu_line(g, query, (reserved or {}).get(f"{node.name}:{g.sample.index}", ""))
                 for g in node.gpus)
    age = max(0.0, now - float(node.snapshot.taken_at or now))
    down_since = node.down_since
    visible = (not query or query.strip().lower() in node.name.lower()
               or any(c.match for g in gpus for c in g.jobs))
    stale = age > stale_s or node.state is NodeState.REMOVED
    drained = None if node.drain is None else f"{node.drain.reason} ({node.drain.by})"
    return NodeCard(node.name, node.error is None and not stale, node.error,
                    age, None if down_since is None else max(0.0, now - down_since),
                    stale, gpus, visible, drained)


# --------------------------------------------------------------------------- queue rows
def queue_key(job: JobView, now: float, aging_per_hour: float,
              fairshare: Mapping[str, float] | None = None) -> tuple:
    """The placer's order (``scheduler.priority.queue_key``), with the last round's fair-share
    points."""
    return priority.queue_key(job.priority, job.owner, job.submitted_at, job.id, now,
                              aging_per_hour, fairshare)


def _where(job: JobView) -> str:
    if not job.node:
        return ""
    return gpus_at(job.node, job.gpu_indices)


def fit_widths(rows: tuple[JobRow, ...], columns: int) -> tuple[int, ...]:
    """The queue table's column widths on a terminal ``columns`` wide (``text.column_widths``
    over what the rows show): nothing is cut where the terminal has room."""
    if not rows:
        return tuple(w for _, w in COLUMNS_WIDTHS)
    return tuple(column_widths(COLUMNS, [r.cells for r in rows], columns, SHRINK, CELL_GAP))


def _row(job: JobView, position: str, now: float, newest: dict[tuple[int, int], int]
         ) -> JobRow:
    if job.state in ON_GPUS:
        since = job.started_at or job.submitted_at
        detail = f"on {_where(job)}" if job.node else job.reason
        if job.node and job.idle:   # marked idle (controller/round/steps/idle.py)
            detail += f" - {job.reason}"
    else:
        since = job.submitted_at
        detail = job.reason or "not looked at yet"
        if job.expected_start is not None:   # the controller's forecast (foresight.py)
            detail += f" - expected ~{moment(max(job.expected_start, now), now)}"
    cells = (position, job_label(job, newest), job.owner, job.name, job.state.value,
             str(job.gpus), duration(now - since), detail)
    return JobRow(job.id, job.owner, job.name, job.state, cells)


def job_rows(jobs: list[JobView], now: float, query: str = "",
             aging_per_hour: float = Policy().aging_per_hour,
             fairshare: Mapping[str, float] | None = None) -> tuple[JobRow, ...]:
    """Queued jobs in scheduling order (numbered), then held ones, then those on GPUs.

    Positions count the whole queue, so a filtered view still says where a job really stands.
    """
    queued = sorted((j for j in jobs if j.state is JobState.QUEUED),
                    key=lambda j: queue_key(j, now, aging_per_hour, fairshare))
    held = [j for j in jobs if j.state is JobState.HELD]
    active = [j for j in jobs if j.state in ON_GPUS]
    newest = newest_runs(jobs)
    rows = [_row(j, str(i), now, newest) for i, j in enumerate(queued, 1)
            if job_matches(j, query)]
    rows += [_row(j, "-", now, newest) for j in held if job_matches(j, query)]
    rows += [_row(j, "-", now, newest) for j in active if job_matches(j, query)]
    return tuple(rows)


def summary(status: StatusView) -> str:
    return ", ".join(f"{n} {s}" for s, n in status.unfinished().items()) or "queue empty"


def build_view(data: MonitorData, now: float, query: str = "") -> View:
    """Everything the screen shows, from one refresh's data and the time to measure ages at."""
    status = data.status
    poll_s = poll_interval(status)
    stale_s = (STALE_POLLS * poll_s if status.stale_after_s is None     # views.stale_after_s
               else status.stale_after_s)
    held = reserved_text(status)
    nodes = tuple(node_card(n, now, stale_s, query, held) for n in status.nodes)
    aging = priority.recorded_aging(status.controller.aging_per_hour)   # as the lab runs it
    return View(banner(data, now), nodes,
                job_rows(data.jobs, now, query, aging, status.fairshare_points),
                summary(status), poll_s)

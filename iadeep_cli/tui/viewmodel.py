"""The monitor's view model: controller data in, immutable display rows out. Pure, no Textual.

Keeping this separate from the widgets lets the tests check *what* is shown (ages, queue order,
slowdown levels, filtering) without a terminal, lets the benchmark time it as a baseline, and
lets the widgets skip work when a card's value has not changed (frozen dataclasses compare by
value). Ages are computed from ``taken_at``/``submitted_at`` and an injected ``now``, never from
the clock, so the same data always renders the same screen.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..controller.views import STALE_POLLS
from ..inventory import Policy
from ..jobs import ACTIVE, UNFINISHED, JobState
from ..text import duration
from .source import MonitorData

ACTIVE_STATES = frozenset(s.value for s in ACTIVE | {JobState.LOST})   # shown where they run
# A job's speed is its throughput relative to running alone (1.0 = no slowdown).
SPEED_OK = 0.85
SPEED_WARN = 0.6
DEFAULT_POLL_S = 10.0
# Fixed widths: the table never re-measures 3,000 rows; longer text is cut at the column edge.
COLUMNS_WIDTHS = (("#", 4), ("ID", 5), ("USER", 8), ("NAME", 16), ("STATE", 7), ("GPUS", 4),
                  ("AGE", 5), ("REASON / WHERE", 72))
COLUMNS = tuple(label for label, _ in COLUMNS_WIDTHS)
COLUMN_KEYS = ("pos", "id", "user", "name", "state", "gpus", "age", "reason")


@dataclass(frozen=True)
class JobChip:
    """A job on a GPU; ``level`` says how much sharing slows it (ok / warn / bad / none)."""

    id: int
    user: str
    name: str
    predicted: float | None
    observed: float | None
    level: str
    match: bool = True


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


@dataclass(frozen=True)
class JobRow:
    """One row of the queue table; ``cells`` follow ``COLUMNS``."""

    id: int
    user: str
    name: str
    state: str
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


def job_matches(job: dict, query: str) -> bool:
    user, text = parse_query(query)
    if user is not None and job.get("user") != user:
        return False
    if not text:
        return True
    hay = " ".join(str(job.get(k) or "") for k in ("id", "name", "user", "state", "node",
                                                   "reason"))
    return text in hay.lower() or text.lstrip("#") == str(job.get("id"))


def poll_interval(status: dict) -> float:
    ctl = status.get("controller") or {}
    try:
        value = float(ctl.get("poll_interval_s") or DEFAULT_POLL_S)
    except (TypeError, ValueError):
        value = DEFAULT_POLL_S
    return min(60.0, max(1.0, value))


# --------------------------------------------------------------------------- banner
def banner(data: MonitorData, now: float) -> Banner:
    if data.stale_since is None:
        return Banner("live", "controller running; refreshing every "
                              f"{duration(poll_interval(data.status))}")
    if not data.stale_since:
        return Banner("never", "controller NOT running (it has never run with this state "
                               "directory): start it with `iadeep controller run`")
    age = duration(now - data.stale_since)
    return Banner("stale", f"controller NOT running: last heartbeat {age} ago; showing the "
                           "last recorded state")


# --------------------------------------------------------------------------- cluster cards
def _gpu_line(gpu: dict, query: str) -> GpuLine:
    chips = tuple(
        JobChip(j["id"], j["user"], j["name"], j.get("predicted_speed"), j.get("observed_speed"),
                speed_level(j.get("predicted_speed"), j.get("observed_speed")),
                match=not query or job_matches(j, query))
        for j in gpu.get("jobs", ()))
    foreign = tuple(Foreign(p["pid"], p.get("name") or "", p.get("used_memory_mib"))
                    for p in gpu.get("processes", ()) if p.get("job_id") is None)
    running = {c.id for c in chips}
    gone = tuple(sorted({p["job_id"] for p in gpu.get("processes", ())
                         if p.get("job_id") is not None and p["job_id"] not in running}))
    return GpuLine(gpu["index"], gpu.get("name") or "", gpu.get("utilization_gpu"),
                   gpu.get("memory_used_mib"), gpu.get("memory_total_mib"), chips, foreign,
                   gone)


def node_card(node: dict, now: float, stale_s: float, query: str = "") -> NodeCard:
    """A node is up only while its data is younger than ``stale_s`` and the controller still
    polls it (a node removed from the inventory keeps its last snapshot); a node without fresh
    data that was not failing is stale, neither up nor down."""
    gpus = tuple(_gpu_line(g, query) for g in node.get("gpus", ()))
    age = max(0.0, now - float(node.get("taken_at") or now))
    down_since = node.get("down_since")
    visible = (not query or query.strip().lower() in node["name"].lower()
               or any(c.match for g in gpus for c in g.jobs))
    stale = age > stale_s or node.get("state") == "removed"
    return NodeCard(node["name"], node.get("error") is None and not stale, node.get("error"),
                    age, None if down_since is None else max(0.0, now - down_since),
                    stale, gpus, visible)


# --------------------------------------------------------------------------- queue rows
def queue_key(job: dict, now: float, aging_per_hour: float) -> tuple:
    """Mirrors scheduler.placement.order_queue: priority plus ageing, then age, then id."""
    waited_h = max(0.0, now - job["submitted_at"]) / 3600.0
    return (-(job.get("priority", 0) + aging_per_hour * waited_h), job["submitted_at"], job["id"])


def _where(job: dict) -> str:
    if not job.get("node"):
        return ""
    return f"{job['node']}:{','.join(str(i) for i in job.get('gpu_indices') or ())}"


def _row(job: dict, position: str, now: float) -> JobRow:
    state = job["state"]
    if state in ACTIVE_STATES:
        since = job.get("started_at") or job["submitted_at"]
        detail = f"on {_where(job)}" if job.get("node") else job.get("reason") or ""
    else:
        since = job["submitted_at"]
        detail = job.get("reason") or "not looked at yet"
    cells = (position, str(job["id"]), job["user"], job["name"], state, str(job.get("gpus", 1)),
             duration(now - since), detail)
    return JobRow(job["id"], job["user"], job["name"], state, cells)


def job_rows(jobs: list[dict], now: float, query: str = "",
             aging_per_hour: float = Policy().aging_per_hour) -> tuple[JobRow, ...]:
    """Queued jobs in scheduling order (numbered), then held ones, then those on GPUs.

    Positions count the whole queue, so a filtered view still says where a job really stands.
    """
    queued = sorted((j for j in jobs if j["state"] == JobState.QUEUED),
                    key=lambda j: queue_key(j, now, aging_per_hour))
    held = [j for j in jobs if j["state"] == JobState.HELD]
    active = [j for j in jobs if j["state"] in ACTIVE_STATES]
    rows = [_row(j, str(i), now) for i, j in enumerate(queued, 1) if job_matches(j, query)]
    rows += [_row(j, "-", now) for j in held if job_matches(j, query)]
    rows += [_row(j, "-", now) for j in active if job_matches(j, query)]
    return tuple(rows)


def summary(status: dict) -> str:
    queue = status.get("queue") or {}
    parts = [f"{queue[s.value]} {s}" for s in UNFINISHED if queue.get(s.value)]
    return ", ".join(parts) or "queue empty"


def build_view(data: MonitorData, now: float, query: str = "") -> View:
    """Everything the screen shows, from one refresh's data and the time to measure ages at."""
    poll_s = poll_interval(data.status)
    stale_s = data.status.get("stale_after_s", STALE_POLLS * poll_s)   # views.stale_after_s
    nodes = tuple(node_card(n, now, stale_s, query) for n in data.status.get("nodes", ()))
    ctl = data.status.get("controller") or {}
    aging = ctl.get("aging_per_hour", Policy().aging_per_hour)  # the lab's, as its controller runs
    return View(banner(data, now), nodes, job_rows(data.jobs, now, query, aging),
                summary(data.status), poll_s)

"""The read-only requests, answered the same way from wherever the recorded state is.

The controller answers them from its database (``service.Service`` is a ``StoreReader``); when
it is down the client answers them itself, from the database if it may read it (a
``StoreReader`` without an inventory) or from the controller's public snapshot
(``offline.SnapshotReader``), and labels them with their age, so `iadeep status` still helps.
The handlers below (``list_jobs`` ... ``profiles``) are the operations table's for all three.
"""
from __future__ import annotations

import abc
import dataclasses
import sqlite3
import time
from collections.abc import Callable

from ...jobs import ACTIVE, FINISHED, UNFINISHED, JobState
from ...messages import (
    ControllerView,
    DrainView,
    EventView,
    ForeignIdleView,
    GpuJob,
    GpuView,
    ImpactView,
    JobDetail,
    JobView,
    ListRequest,
    NodeState,
    NodeView,
    ProfilesRequest,
    ProfileView,
    ShowRequest,
    StatusRequest,
    StatusView,
)
from ...settings import Inventory
from ...snapshot import NodeSnapshot
from ...store import Store, cluster, foreign, impact, jobrows
from .. import fairshare, runtimes
from ..fairshare import priority_view

# A node's data older than this many poll intervals no longer says it is up: the controller
# stopped, or stopped polling it (see stale_after_s).
STALE_POLLS = 3
DEFAULT_POLL_S = 10.0

HIDDEN = "(hidden)"
Reveal = Callable[[str], bool]   # may this reader see the env values of this owner's jobs?


def everyone(owner: str) -> bool:
    return True


class Reader(abc.ABC):
    """Where the read-only requests are answered from."""

    def reveal(self, user: str) -> Reveal:
        """Whose jobs' env values ``user`` may see (all: whoever reads the recorded state
        directly could read the values there too)."""
        return everyone

    @abc.abstractmethod
    def jobs(self, all_states: bool, owner: str | None, last: int | None = None,
             before: int | None = None) -> list[JobView]:
        """Unfinished jobs (all with ``all_states``), of ``owner`` only if given, oldest
        first; the newest ``last`` of those with ids below ``before`` if given."""

    @abc.abstractmethod
    def job(self, job_id: int) -> JobDetail:
        """One job and its events, or a NotFoundError."""

    @abc.abstractmethod
    def status(self) -> StatusView: ...

    @abc.abstractmethod
    def profiles(self) -> list[ProfileView]: ...


# ------------------------------------------------------------------ the read-only operations
def list_jobs(reader: Reader, user: str, req: ListRequest) -> list[JobView]:
    reveal = reader.reveal(user)
    last, before = req.page()
    return [for_reader(j, reveal) for j in reader.jobs(req.all_states, req.owner, last, before)]


def show_job(reader: Reader, user: str, req: ShowRequest) -> JobDetail:
    detail = reader.job(req.id)
    return dataclasses.replace(detail, job=for_reader(detail.job, reader.reveal(user)))


def status(reader: Reader, user: str, req: StatusRequest) -> StatusView:
    return reader.status()


def profiles(reader: Reader, user: str, req: ProfilesRequest) -> list[ProfileView]:
    return reader.profiles()


def for_reader(job: JobView, reveal: Reveal) -> JobView:
    """A job as one reader may see it: ``--env`` and ``--export`` values (often tokens) only if
    ``reveal`` allows it for the job's owner (the owner and the admins); the names stay
    visible."""
    if reveal(job.owner):
        return job
    return dataclasses.replace(job, env=dict.fromkeys(job.env, HIDDEN),
                               exported=dict.fromkeys(job.exported, HIDDEN))


# ------------------------------------------------------------------ from the database
class StoreReader(Reader):
    """The database. ``inventory``: the running controller's (None: it is not running)."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time,
                 inventory: Inventory | None = None):
        self.store = store
        self.clock = clock
        self.inventory = inventory

    # Each read is a snapshot on a connection of its own (Store.read), never the writer's
    # lock: a member reading a long history does not hold up the scheduling round.
    def jobs(self, all_states: bool, owner: str | None, last: int | None = None,
             before: int | None = None) -> list[JobView]:
        with self.store.read() as conn:
            rows = jobrows.select(conn, states=None if all_states else UNFINISHED,
                                  owner=owner, last=last, before=before)
        return [JobView.from_job(j) for j in rows]

    def job(self, job_id: int) -> JobDetail:
        with self.store.read() as conn:
            detail = job_detail(conn, job_id)
            now = self.clock()
            runtime = None
            if detail.job.state not in FINISHED:
                runtime = runtimes.estimate(jobrows.get(conn, job_id),
                                            runtimes.history(conn, now), now)
            return dataclasses.replace(detail, priority=priority_view(
                conn, detail.job, now, self.inventory), runtime=runtime)

    def status(self) -> StatusView:
        from .. import reservations  # `iadeep reserve`: the GPUs reservations hold
        with self.store.read() as conn:
            view = status_view(conn, self.clock(), self.inventory)
            return dataclasses.replace(view, reservations=reservations.status(conn, self.clock()))

    def profiles(self) -> list[ProfileView]:
        with self.store.read() as conn:
            return profile_list(conn)


def select_jobs(conn: sqlite3.Connection, *, all_states: bool = False,
                owner: str | None = None, reveal: Reveal = everyone) -> list[JobView]:
    states = None if all_states else UNFINISHED
    return [for_reader(JobView.from_job(j), reveal)
            for j in jobrows.select(conn, states=states, owner=owner)]


def job_detail(conn: sqlite3.Connection, job_id: int) -> JobDetail:
    job = JobView.from_job(jobrows.get(conn, job_id))
    return JobDetail(job, tuple(EventView.from_dict(e) for e in jobrows.events(conn, job_id)))


def profile_list(conn: sqlite3.Connection | None = None) -> list[ProfileView]:
    """Every known profile (``conn`` None: the shipped ones alone)."""
    from ..catalog import profile_views

    return [ProfileView.from_dict(p) for p in profile_views(conn)]


def stale_after_s(inventory: Inventory | None, controller: ControllerView) -> float:
    """How old a node's data may be and still say "up": STALE_POLLS poll intervals. While the
    controller runs (``inventory`` is its own), at least the grace it gives a silent node: a
    round that waits for a hung node's poll can outlast several intervals, and the healthy
    nodes' data then ages meanwhile without being stale."""
    if inventory is None:
        return STALE_POLLS * float(controller.poll_interval_s or DEFAULT_POLL_S)
    return max(STALE_POLLS * inventory.poll_interval_s, inventory.node_grace_s)


def node_state(snap: NodeSnapshot, age_s: float, stale_s: float,
               inventory: Inventory | None) -> NodeState:
    """``up`` only while fresh; ``removed`` if the running controller's ``inventory`` (None:
    it is not running) no longer lists it; ``down`` while it fails to answer; ``stale`` when
    its last answer is older than ``stale_s``."""
    if inventory is not None and inventory.node(snap.name) is None:
        return NodeState.REMOVED
    if snap.error is not None:
        return NodeState.DOWN
    return NodeState.STALE if age_s > stale_s else NodeState.UP


def status_view(conn: sqlite3.Connection, now: float,
                inventory: Inventory | None = None) -> StatusView:
    """Nodes, their GPUs and what runs on each, the queue summary and how old the data is.
    ``inventory``: the running controller's (None: read from the database, it is not running)."""
    on_gpu: dict[tuple[str | None, int], list[GpuJob]] = {}
    for job in jobrows.select(conn, states=ACTIVE):
        for index in job.gpu_indices:
            on_gpu.setdefault((job.node, index), []).append(GpuJob(
                job.id, job.name, job.owner, job.state, job.predicted_speed, job.observed_speed,
                job.idle_since if job.idle_marked else None))   # still idle
    controller = ControllerView.from_dict(cluster.get_meta(conn, "controller", {}))
    stale_s = stale_after_s(inventory, controller)
    drained = cluster.drained(conn)
    nodes = []
    for snap, down_since in cluster.load_nodes(conn):
        age = max(0.0, now - snap.taken_at)
        gpus = tuple(GpuView(g, tuple(on_gpu.get((snap.name, g.index), ()))) for g in snap.gpus)
        drain = drained.get(snap.name)
        nodes.append(NodeView(snap, gpus, age, down_since,
                              node_state(snap, age, stale_s, inventory),
                              None if drain is None else DrainView.from_dict(drain)))
    counts = dict(conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
    return StatusView(now=now, nodes=tuple(nodes),
                      queue={s: counts.get(s.value, 0) for s in JobState},
                      controller=controller, stale_after_s=stale_s,
                      impact_last_hour=impact_view(conn, now - 3600, now),
                      impact_since_start=impact_view(conn, controller.started_at, now)
                      if controller.started_at is not None else None,
                      fairshare_points=fairshare.points(conn, inventory),
                      foreign_idle=tuple(   # foreign processes holding a GPU idle (foreign.py)
                          ForeignIdleView(s.node, s.gpu, s.pid, s.name, s.mib, s.since)
                          for s in foreign.open_spells(conn)) or None)


def impact_view(conn: sqlite3.Connection, since: float, until: float) -> ImpactView:
    """The impact factor and its parts over [since, until), as recorded (store/impact.py)."""
    w = impact.window(conn, since, until)
    return ImpactView(since=since, until=until, busy_gpu_hours=round(w.busy_s / 3600, 6),
                      work_gpu_hours=round(w.work_s / 3600, 6),
                      saved_gpu_hours=round(w.saved_s / 3600, 6),
                      impact_factor=None if w.impact_factor is None
                      else round(w.impact_factor, 6),
                      measured_share=None if w.measured_share is None
                      else round(w.measured_share, 6),
                      energy_kwh=round(w.energy_j / 3.6e6, 6))

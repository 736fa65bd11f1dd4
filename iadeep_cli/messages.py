"""The controller's protocol: one typed request per operation, one typed view per answer.

The controller answers these (``controller.service``), the CLI and the monitor send them
(``controller.client``), and while the controller is down the client answers the read-only
ones itself (``controller.offline``); all of them share this vocabulary, which imports none of
them. A new request or view field is one line here.

Wire format: a request travels as ``{"op": Request.op, "args": request.to_dict()}``, a reply
as ``encode(view)``, and ``--json`` prints that very JSON. A field's JSON key is its name,
unless its metadata says otherwise (``wire("user")``: a job's ``owner`` has always travelled
as "user"); an ``optional()`` field is left out while it is None (a key only some answers have).

Requests come from any local account: ``Request.from_dict`` checks every argument against its
field's annotation (``checks.typed``) and refuses unknown and missing ones. Replies come from
the controller, which is trusted: ``decode`` converts them without checking.
"""
from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from . import checks
from .codec import Message, _fields, _hints, decode, encode, optional, wire
from .errors import IadeepError, InputError
from .jobs import FINISHED, Job, JobState, SubmitSpec
from .profiles import Profile
from .snapshot import GpuSample, NodeSnapshot, gpu_from_dict, node_from_dict, to_dict

R = TypeVar("R")
_MALFORMED_HINT = "client and controller versions differ?"


# ============================================================================ views (replies)
@dataclass(frozen=True)
class JobView(Message):
    """A job as a reader sees it (``queue list``, ``queue show``); ``env`` values may read
    "(hidden)" for readers other than the owner and the admins."""

    id: int
    name: str
    owner: str = field(metadata=wire("user"))
    state: JobState
    gpus: int
    node: str | None
    gpu_indices: tuple[int, ...]
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    script: str
    args: tuple[str, ...]
    workdir: str | None
    env: dict[str, str]
    mem_gib: float | None
    workload: str | None
    priority: int
    exclusive: bool
    retries: int
    min_speed: float | None
    time_limit_s: float | None
    signal: str | None
    notify: str
    attempts: int
    remote_pid: int | None
    reason: str
    predicted_speed: float | None
    observed_speed: float | None
    # Submitting like sbatch: where it was submitted from, its output files, its node rules.
    submit_dir: str | None = None
    output: str | None = None
    error: str | None = None
    constraint: tuple[str, ...] = ()
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    exported: dict[str, str] = field(default_factory=dict)   # --export's values, like env
    # Only on the jobs that have them (keys the JSON has only then):
    after: tuple[int, ...] | None = optional()        # --after
    after_any: tuple[int, ...] | None = optional()    # --after-any
    after_fail: tuple[int, ...] | None = optional()   # --after-fail
    array: str | None = optional()                    # --array as written
    array_id: int | None = optional()                 # the array it is a task of
    array_index: int | None = optional()
    retry_on_fail: bool | None = optional()
    rerun_of: int | None = optional()                 # `queue rerun` made it from this job
    no_adapt: bool | None = optional()                # --no-adapt: never suspended
    suspended_s: float | None = optional()            # seconds suspended (ended suspensions)
    checkpoint_signal: str | None = optional()        # --checkpoint-signal
    checkpoints: int | None = optional()              # attempts ended by a checkpoint
    opportunistic: bool | None = optional()           # --opportunistic
    idle_after_s: float | None = optional()           # --idle-after
    requeue: bool | None = optional()                 # --requeue
    # asked to checkpoint and be requeued, this attempt: for which job or by whom ("job 7",
    # "alice"); its signal is sent (or about to be)
    requeueing: str | None = optional()
    preempted: str | None = optional()   # waiting after "preempted for job 7 at 14:02; requeued"
    begin_at: float | None = optional()               # --begin
    cpus_per_task: int | None = optional()            # --cpus-per-task
    host_mem_mib: int | None = optional()             # --mem: host RAM (MiB)
    idle: bool | None = optional()                    # marked idle now (its GPUs sat idle)
    # the controller's forecast (controller/foresight.py), where it has one: a waiting job's
    # expected start with its range, an unfinished job's expected end (epoch seconds)
    expected_start: float | None = optional()
    expected_start_low: float | None = optional()
    expected_start_high: float | None = optional()
    expected_end: float | None = optional()

    @classmethod
    def from_job(cls, job: Job) -> JobView:
        spec = job.spec
        return cls(
            id=job.id, name=job.name, owner=job.owner, state=job.state, gpus=spec.gpus,
            node=job.node, gpu_indices=job.gpu_indices, submitted_at=job.submitted_at,
            started_at=job.started_at, ended_at=job.ended_at, exit_code=job.exit_code,
            script=spec.script, args=spec.args, workdir=spec.workdir, env=dict(spec.env),
            mem_gib=spec.mem_gib, workload=spec.workload, priority=spec.priority,
            exclusive=spec.exclusive, retries=spec.retries, min_speed=spec.min_speed,
            time_limit_s=spec.time_limit_s, signal=spec.signal, notify=spec.notify,
            attempts=job.attempts,
            remote_pid=job.remote_pid, reason=job.reason, predicted_speed=job.predicted_speed,
            observed_speed=job.observed_speed, submit_dir=spec.submit_dir, output=spec.output,
            error=spec.error, constraint=spec.constraint, nodelist=spec.nodelist,
            exclude=spec.exclude, exported=dict(spec.exported), after=spec.after or None,
            after_any=spec.after_any or None, after_fail=spec.after_fail or None,
            array=spec.array, array_id=job.array_id, array_index=job.array_index,
            retry_on_fail=spec.retry_on_fail or None, rerun_of=job.rerun_of,
            no_adapt=spec.no_adapt or None,
            suspended_s=round(job.suspended_s, 1) or None,
            checkpoint_signal=spec.checkpoint_signal, checkpoints=job.checkpoints or None,
            opportunistic=spec.opportunistic or None, idle_after_s=spec.idle_after_s,
            requeue=spec.requeue or None, requeueing=job.preempt_for,
            preempted=job.preempted or None, begin_at=spec.begin_at,
            cpus_per_task=spec.cpus_per_task, host_mem_mib=spec.host_mem_mib,
            idle=job.idle_marked or None)


@dataclass(frozen=True)
class EventView(Message):
    """One state change of a job (``old_state`` None: its submission)."""

    at: float
    old_state: JobState | None
    new_state: JobState
    reason: str
    actor: str


@dataclass(frozen=True)
class FairShareView(Message):
    """A user's fair share as the last scheduling round worked it out (docs/scheduling.md
    "Fair share"):
    ``factor`` = 2^(-usage_norm/share_norm), worth ``points`` = weight x factor."""

    user: str
    usage_gpu_h: float       # decayed GPU-hours
    usage_norm: float        # of everyone's decayed usage
    share: float
    share_norm: float        # of the shares of the users that count now
    factor: float
    weight: float
    points: float
    half_life_days: float
    at: float                # when that round ran


@dataclass(frozen=True)
class PriorityView(Message):
    """A waiting job's effective priority and its parts: ``effective`` = ``base`` + ``aging``
    + the fair-share points (``fairshare``: None while fair share is off, or before a round
    counted the owner: ``fairshare_on`` tells which)."""

    effective: float
    base: int
    aging: float
    aging_per_hour: float
    fairshare_on: bool = False
    fairshare: FairShareView | None = None


@dataclass(frozen=True)
class RuntimeView(Message):
    """The run-time estimate placement uses for a job (``scheduler.remaining.RuntimeEstimate``):
    the median run time in all and its 10%-90% range, in seconds from its start, and what it
    rests on ("--time", "user+label history", "label history", "default", ...)."""

    seconds: float
    low_s: float
    high_s: float
    source: str


@dataclass(frozen=True)
class ForecastView(Message):
    """When a job is expected to start and end (``scheduler.forecast``: the queue simulated
    forward with plan()), epoch seconds with their low-high range; where it would start
    (``node``, ``gpus``), beside which jobs, at what predicted speed; ``source``: what its run
    time rests on; ``made_at``: when the forecast was made. ``start`` None: not foreseen within
    the forecast's horizon."""

    start: float | None
    start_low: float | None
    start_high: float | None
    end: float | None
    end_low: float | None
    end_high: float | None
    node: str | None = None
    gpus: tuple[int, ...] = ()
    beside: tuple[int, ...] = ()
    speed: float | None = None
    source: str = ""
    made_at: float = 0.0

    def at(self, made_at: float) -> ForecastView:
        """These figures as a reply carries them, made at ``made_at`` (a
        ``scheduler.forecast.JobForecast`` is one, with its job's id beside)."""
        figures = {f.name: getattr(self, f.name) for f in dataclasses.fields(ForecastView)}
        return ForecastView(**{**figures, "made_at": made_at})


@dataclass(frozen=True)
class JobDetail(Message):
    """``queue show``: the job's fields and its history (JSON: the job's keys plus "events",
    for a waiting job "effective_priority" where the reader knows the policy, and for an
    unfinished one "runtime_estimate" where it reads the lab's history)."""

    job: JobView
    events: tuple[EventView, ...] = ()
    priority: PriorityView | None = None
    runtime: RuntimeView | None = None   # an unfinished job's run-time estimate (JSON:
                                         # "runtime_estimate"), where the reader has history
    forecast: ForecastView | None = None   # the controller's forecast (JSON: "forecast")

    def to_dict(self) -> dict[str, Any]:
        out = {**self.job.to_dict(), "events": encode(self.events)}
        if self.priority is not None:
            out["effective_priority"] = self.priority.to_dict()
        if self.runtime is not None:
            out["runtime_estimate"] = self.runtime.to_dict()
        if self.forecast is not None:
            out["forecast"] = self.forecast.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobDetail:
        parts = data.get("effective_priority")
        runtime = data.get("runtime_estimate")
        ahead = data.get("forecast")
        return cls(JobView.from_dict(data), decode(tuple[EventView, ...], data["events"]),
                   None if parts is None else PriorityView.from_dict(parts),
                   None if runtime is None else RuntimeView.from_dict(runtime),
                   None if ahead is None else ForecastView.from_dict(ahead))


@dataclass(frozen=True)
class GpuJob(Message):
    """An iadeep job placed on a GPU, and how fast it runs there (1.0: as fast as alone)."""

    id: int
    name: str
    owner: str = field(metadata=wire("user"))
    state: JobState
    predicted_speed: float | None
    observed_speed: float | None
    idle_since: float | None = optional()   # its GPUs sat idle since then (steps/idle.py)


@dataclass(frozen=True)
class GpuView(Message):
    """A GPU as last polled (JSON: the sample's keys plus "jobs"), and the jobs placed on it."""

    sample: GpuSample
    jobs: tuple[GpuJob, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**encode(dataclasses.asdict(self.sample)), "jobs": encode(self.jobs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuView:
        sample = {k: v for k, v in data.items() if k != "jobs"}
        return cls(gpu_from_dict(sample), decode(tuple[GpuJob, ...], data.get("jobs", ())))


class NodeState(str, enum.Enum):
    """What a node's last snapshot says now (``controller.views.node_state``)."""

    UP = "up"              # it answered, and recently
    DOWN = "down"          # its last poll failed
    STALE = "stale"        # its last answer is too old to say it is up
    REMOVED = "removed"    # the running controller's inventory no longer lists it

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class DrainView(Message):
    """Why a node takes no new jobs (`iadeep nodes drain`): its running jobs finish."""

    reason: str
    by: str
    at: float


@dataclass(frozen=True)
class NodeView(Message):
    """A node's last snapshot, how old it is and what that means (JSON: the snapshot's keys,
    its GPUs with their jobs, then "age_s", "down_since", "state")."""

    snapshot: NodeSnapshot      # as recorded; ``gpus`` are its GPUs with their jobs
    gpus: tuple[GpuView, ...]
    age_s: float
    down_since: float | None
    state: NodeState
    drain: DrainView | None = None   # drained by an admin: no new jobs there

    @property
    def name(self) -> str:
        return self.snapshot.name

    @property
    def error(self) -> str | None:
        return self.snapshot.error

    def to_dict(self) -> dict[str, Any]:
        return {**encode(to_dict(self.snapshot)), "gpus": encode(self.gpus),
                "age_s": self.age_s, "down_since": self.down_since, "state": self.state.value,
                "drain": None if self.drain is None else encode(self.drain)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeView:
        gpus = decode(tuple[GpuView, ...], data.get("gpus", ()))
        snapshot = node_from_dict({k: data[k] for k in _fields(NodeSnapshot) if k in data
                                   and k != "gpus"})
        drain = data.get("drain")
        return cls(dataclasses.replace(snapshot, gpus=tuple(g.sample for g in gpus)), gpus,
                   data["age_s"], data["down_since"], NodeState(data["state"]),
                   None if drain is None else DrainView.from_dict(drain))


@dataclass(frozen=True)
class ControllerView(Message):
    """The controller's heartbeat record (``runtime.Controller.heartbeat``); empty (JSON
    ``{}``) where no controller ever ran. ``degraded``: why it refuses new jobs, if it does;
    ``rounds_failing``: why its scheduling rounds fail one after another, if they do (it
    accepts jobs, but places none meanwhile)."""

    pid: int | None = None
    started_at: float | None = None
    heartbeat_at: float | None = None
    poll_interval_s: float | None = None
    aging_per_hour: float | None = None
    nodes: tuple[str, ...] = ()
    degraded: IadeepError | None = None
    stopped_at: float | None = optional()   # its last record, written as it stopped
    rounds_failing: str | None = optional()

    @property
    def ran(self) -> bool:
        return self.heartbeat_at is not None

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() if self.ran else {}


@dataclass(frozen=True)
class ImpactView(Message):
    """The impact of sharing over a window (``store/impact.py`` defines it): the work the jobs
    did in exclusive-GPU-hours over the GPU-hours the busy GPUs were busy. ``impact_factor``
    None: no GPU was busy; ``measured_share`` None: no work."""

    since: float
    until: float
    busy_gpu_hours: float
    work_gpu_hours: float
    saved_gpu_hours: float
    impact_factor: float | None
    measured_share: float | None
    energy_kwh: float


@dataclass(frozen=True)
class ReservationView(Message):
    """GPUs kept for ``user`` from ``start`` to ``end`` (`iadeep reserve`); ``held``: the GPUs
    ("node:index") it holds as the last poll has them (empty while none is up)."""

    id: int
    user: str
    gpus: int
    node: str | None
    start: float
    end: float
    created_by: str
    held: tuple[str, ...] = ()


@dataclass(frozen=True)
class ForeignIdleView(Message):
    """A GPU process iadeep did not start that has held GPU ``node:gpu`` idle since ``since``
    (controller/round/steps/foreign.py); ``mib``: its GPU memory."""

    node: str
    gpu: int
    pid: int
    name: str
    mib: float | None
    since: float


@dataclass(frozen=True)
class StatusView(Message):
    """``iadeep status``: nodes and their GPUs, the queue's count per state, the controller,
    and how old a node's data may be and still say it is up (None: no controller ran)."""

    now: float
    nodes: tuple[NodeView, ...]
    queue: dict[JobState, int]
    controller: ControllerView
    stale_after_s: float | None = optional()
    impact_last_hour: ImpactView | None = optional()       # None: no database to read it from
    impact_since_start: ImpactView | None = optional()     # since the controller last started
    # each user's fair-share priority points from the last round (None: fair share is off),
    # so the monitor orders the queue as the controller does
    fairshare_points: dict[str, float] | None = optional()
    # reservations not over yet and the GPUs each holds (the monitor marks them)
    reservations: tuple[ReservationView, ...] | None = optional()
    # foreign processes holding a GPU idle past lab.idle_after (controller/round/steps/foreign.py)
    foreign_idle: tuple[ForeignIdleView, ...] | None = optional()

    def unfinished(self) -> dict[JobState, int]:
        """How many jobs wait or run, per state (states without any left out)."""
        return {s: n for s, n in self.queue.items() if n and s not in FINISHED}


@dataclass(frozen=True)
class ProfileSample(Message):
    """One job's measurement of a workload, and whether learning kept it (``note``: why)."""

    at: float
    job: int | None
    owner: str | None = field(metadata=wire("user"))
    gpu_model: str
    accepted: bool
    note: str | None
    gpu_util: float
    mem_util: float
    peak_mem_gib: float


@dataclass(frozen=True)
class ProfileView(Message):
    """A workload profile, where it comes from, its pin and its newest samples (JSON: the
    profile's keys, then the others)."""

    profile: Profile
    source: str
    updated_at: float | None
    pinned_by: str | None
    pinned_at: float | None
    samples: tuple[ProfileSample, ...]

    def to_dict(self) -> dict[str, Any]:
        own = super().to_dict()
        del own["profile"]
        return {**dataclasses.asdict(self.profile), **own}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileView:
        profile = Profile(**{k: data[k] for k in _fields(Profile) if k in data})
        return super().from_dict({**data, "profile": profile})   # a Profile is taken as it is


@dataclass(frozen=True)
class ColocationView(Message):
    """One co-location row (`iadeep profile pairs`): two workloads' speeds beside each other
    on a GPU model; ``kind`` 'lab' (fits and self-tuning use it) or 'held' (one member's word,
    until another member's jobs agree or an admin adopts it); ``owners``: whose jobs reported
    it (none: recorded as the lab's); ``note``: where it came from."""

    id: int
    gpu_model: str
    workloads: tuple[str, ...]
    speeds: tuple[float, ...]
    samples: int
    owners: tuple[str, ...]
    kind: str
    note: str
    observed_at: float


@dataclass(frozen=True)
class AddResult(Message):
    """The queued job's id; ``created`` False: a retried submission, the first one's id."""

    id: int
    created: bool


@dataclass(frozen=True)
class TrialResult(Message):
    """``queue add --test-only``: whether the job would start now (``now``), else when it is
    expected to (``forecast``; None: not foreseen), and why it would wait (``reason``: plan()'s
    reason now); nothing was queued."""

    now: bool
    reason: str = ""
    forecast: ForecastView | None = None


@dataclass(frozen=True)
class JobActionResult(Message):
    """What cancel/hold/release did to one job: its ``state`` now ("cancelling" while its
    process is being stopped), or the ``error`` that kept it as it was."""

    id: int
    state: str | None = optional()
    error: IadeepError | None = optional()


@dataclass(frozen=True)
class PriorityResult(Message):
    id: int
    priority: int


@dataclass(frozen=True)
class ReloadResult(Message):
    """What a reload changed; only ``pending`` (True) if it waits for the round to end."""

    path: str
    pending: bool | None = optional()
    nodes: tuple[str, ...] | None = optional()
    summary: str | None = optional()
    added: tuple[str, ...] | None = optional()
    removed: tuple[str, ...] | None = optional()
    changed: tuple[str, ...] | None = optional()


@dataclass(frozen=True)
class FenceResult(Message):
    """The fenced node and its jobs, now requeued or failed."""

    node: str
    jobs: tuple[int, ...]


@dataclass(frozen=True)
class DrainResult(Message):
    """The node drained or resumed, and the jobs still running there (drain: they finish)."""

    node: str
    drained: bool           # its state now
    changed: bool           # False: it already was so
    running: tuple[int, ...] = ()


@dataclass(frozen=True)
class PingResult(Message):
    """Who the controller takes the caller for (from the socket), and whether an admin."""

    user: str
    admin: bool


@dataclass(frozen=True, kw_only=True)
class LogChunk(Message):
    """Log bytes from ``offset`` (decoded), where the next read starts, the log's ``size``
    when a read stopped short of it (to ask for the tail), and whether the job is over."""

    data: str
    offset: int
    size: int | None = optional()
    finished: bool
    state: JobState


@dataclass(frozen=True)
class PinResult(Message):
    label: str
    pinned_by: str | None


# ============================================================================ requests
class Request(Message, Generic[R]):
    """A request; ``op`` names it on the wire, ``R`` is its reply's type."""

    op: ClassVar[str]

    @classmethod
    def reply_type(cls) -> Any:
        """The annotation of this request's reply (what ``decode`` turns the result into)."""
        for klass in cls.__mro__:
            for base in klass.__dict__.get("__orig_bases__", ()):
                if typing.get_origin(base) is Request:
                    return typing.get_args(base)[0]
        raise TypeError(f"{cls.__name__} names no reply type")   # a bug, not input

    @classmethod
    def from_dict(cls, args: Mapping[str, Any]) -> Any:
        """The request these untrusted ``args`` make, or an InputError naming what is wrong:
        the caller's name (identity comes from the socket), a missing or unknown argument, or
        one of the wrong type (``checks.typed``)."""
        if "user" in args:
            raise InputError("malformed request: a request cannot name its user",
                             hint="identity comes from the socket (the calling account)")
        fields = _fields(cls)
        for name, f in fields.items():
            if name not in args and f.default is dataclasses.MISSING:
                raise InputError(f"malformed {cls.op!r} request: missing a required argument: "
                                 f"{name!r}", hint=_MALFORMED_HINT)
        for name in args:
            if name not in fields:
                raise InputError(f"malformed {cls.op!r} request: got an unexpected keyword "
                                 f"argument {name!r}", hint=_MALFORMED_HINT)
        hints = _hints(cls)
        return cls(**{k: SubmitSpec.from_dict(v) if hints[k] is SubmitSpec  # checks its own
                      else checks.typed(k, v, hints[k]) for k, v in args.items()})


@dataclass(frozen=True)
class AddRequest(Request[AddResult]):
    """Queue a job. ``spec``: what was asked for (``jobs.SubmitSpec``: its own wire form and
    checks; a field left out takes its default, the lab's for ``LAB_DEFAULTED``);
    ``script_b64``: the script's content, kept with the job; ``token``: a retried submission
    returns the first one's id."""

    op: ClassVar[str] = "add"
    spec: SubmitSpec
    token: str | None = None
    script_b64: str | None = None


@dataclass(frozen=True)
class TrialRequest(Request[TrialResult]):
    """``queue add --test-only``: where and when a job of this ``spec`` would start, checked
    as a submission is, planned against the queue as it is; nothing is queued (no job row, no
    script copy)."""

    op: ClassVar[str] = "test_only"
    spec: SubmitSpec


@dataclass(frozen=True)
class JobsRequest(Request[list[JobActionResult]]):
    """Act on jobs by id; each succeeds or fails on its own. An id that is an array's acts on
    every task of it the action applies to; ``tasks`` are (array id, index) pairs: one task
    alone (the array's first task too)."""

    ids: tuple[int, ...]
    tasks: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class CancelRequest(JobsRequest):
    op: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class HoldRequest(JobsRequest):
    op: ClassVar[str] = "hold"


@dataclass(frozen=True)
class ReleaseRequest(JobsRequest):
    op: ClassVar[str] = "release"


@dataclass(frozen=True)
class RequeueRequest(JobsRequest):
    """Checkpoint running --requeue jobs and queue them again (``iadeep queue requeue``,
    Slurm's ``scontrol requeue``): no retry spent."""

    op: ClassVar[str] = "requeue"


@dataclass(frozen=True)
class PriorityRequest(Request[PriorityResult]):
    """An array's id sets the priority of all its waiting tasks; ``index``: of that one task."""

    op: ClassVar[str] = "priority"
    id: int
    priority: int
    index: int | None = None


@dataclass(frozen=True)
class UpdateResult(Message):
    """The job changed and what changed, each as ``field: old -> new`` for people."""

    id: int
    changes: tuple[str, ...]


@dataclass(frozen=True)
class UpdateRequest(Request[UpdateResult]):
    """`iadeep queue update`: change a job's name, time limit, priority or dependencies
    (``scontrol update``'s everyday uses); None: unchanged. A waiting job takes any of them, a
    running one only a time limit (its owner may lower it, an admin raise it too)."""

    op: ClassVar[str] = "update"
    id: int
    name: str | None = optional()
    time_limit_s: float | None = optional()
    priority: int | None = optional()
    after: tuple[int, ...] | None = optional()
    after_any: tuple[int, ...] | None = optional()
    after_fail: tuple[int, ...] | None = optional()


@dataclass(frozen=True)
class RerunRequest(Request[AddResult]):
    """Submit finished job ``id`` again with its spec (a new job); ``token`` as AddRequest's."""

    op: ClassVar[str] = "rerun"
    id: int
    token: str | None = None


@dataclass(frozen=True)
class ReloadRequest(Request[ReloadResult]):
    op: ClassVar[str] = "reload"


@dataclass(frozen=True)
class FenceRequest(Request[FenceResult]):
    op: ClassVar[str] = "fence"
    node: str
    force: bool | None = optional()   # fence a node heard from within node_grace too


@dataclass(frozen=True)
class DrainRequest(Request[DrainResult]):
    """Drain ``node`` (no new jobs; running ones finish), or resume it (``resume``)."""

    op: ClassVar[str] = "drain"
    node: str
    reason: str | None = optional()   # required to drain: shown wherever the node is
    resume: bool | None = optional()


@dataclass(frozen=True)
class PingRequest(Request[PingResult]):
    op: ClassVar[str] = "ping"


@dataclass(frozen=True)
class ReportRequest(Request[dict]):
    """`iadeep report` through the controller, for those who may not read its database: the
    window [since, until), as ``store.report``'s arguments; ``daily``: also the report by day
    (for --plot). The reply is ``{"report": ..., "daily": ...}`` as ``report_to_dict`` makes."""

    op: ClassVar[str] = "report"
    since: float
    until: float
    by: str | None = optional()
    owner: str | None = optional()    # only this user's jobs
    running: bool | None = optional()
    daily: bool | None = optional()


@dataclass(frozen=True)
class ListRequest(Request[list[JobView]]):
    """Unfinished jobs (every job with ``all_states``), of one ``owner`` if given, oldest
    first. ``limit``: only the newest ``limit`` of them (``all_states`` alone: LIST_ALL_LIMIT
    unless given; at most LIST_MAX); ``before``: only jobs with smaller ids (the next page
    back: the smallest id of this one)."""

    op: ClassVar[str] = "list"
    all_states: bool = False
    owner: str | None = None
    limit: int | None = None
    before: int | None = None

    def page(self) -> tuple[int | None, int | None]:
        """(how many of the newest, below which id), the defaults applied; InputError for a
        limit out of range."""
        limit = self.limit if self.limit is not None else (
            LIST_ALL_LIMIT if self.all_states else None)
        if limit is not None and not 1 <= limit <= LIST_MAX:
            raise InputError(f"list limit {limit} is out of range",
                             hint=f"give a limit from 1 to {LIST_MAX}; page back with "
                                  "--before ID")
        return limit, self.before


# `queue list --all`'s page: a lab's whole history in one reply cost seconds of a round before
# reads had their own connection (13,000 jobs, 10 MB), and nobody reads that many lines.
LIST_ALL_LIMIT = 1000
LIST_MAX = 10000


@dataclass(frozen=True)
class ShowRequest(Request[JobDetail]):
    op: ClassVar[str] = "show"
    id: int


@dataclass(frozen=True)
class StatusRequest(Request[StatusView]):
    op: ClassVar[str] = "status"


@dataclass(frozen=True)
class LogsRequest(Request[LogChunk]):
    op: ClassVar[str] = "logs"
    id: int
    offset: int = 0
    max_bytes: int = 65536
    stream: str = "output"   # "error": the job's --error file (``iadeep logs --stderr``)


@dataclass(frozen=True)
class InputRequest(Request[JobActionResult]):
    """Keystrokes (base64) for the caller's own running `iadeep run --pty` job."""
    op: ClassVar[str] = "input"
    id: int
    data_b64: str


@dataclass(frozen=True)
class ProfilesRequest(Request[list[ProfileView]]):
    op: ClassVar[str] = "profiles"


@dataclass(frozen=True)
class ProfilePinRequest(Request[PinResult]):
    """``adopt``: the user whose held phase profile of ``label`` becomes the lab's first."""

    op: ClassVar[str] = "profile_pin"
    label: str
    adopt: str | None = optional()


@dataclass(frozen=True)
class ProfileUnpinRequest(Request[PinResult]):
    op: ClassVar[str] = "profile_unpin"
    label: str


@dataclass(frozen=True)
class PairsRequest(Request[list[ColocationView]]):
    """Every co-location row, held or the lab's (admins only)."""

    op: ClassVar[str] = "profile_pairs"


@dataclass(frozen=True)
class PairsAdoptRequest(Request[list[ColocationView]]):
    """Make held co-location rows the lab's (admins only); the rows as they are after."""

    op: ClassVar[str] = "profile_pair_adopt"
    ids: tuple[int, ...]


@dataclass(frozen=True)
class PairsRemoveRequest(Request[list[ColocationView]]):
    """Remove co-location rows (admins only); the rows removed."""

    op: ClassVar[str] = "profile_pair_remove"
    ids: tuple[int, ...]


# Reservations (`iadeep reserve`, controller/requests/reservations.py): add and delete are admins'.
@dataclass(frozen=True)
class ReserveAddRequest(Request[ReservationView]):
    """Keep ``gpus`` GPUs (on ``node``, else on one node the scheduler picks) for user
    ``for_user`` from ``start`` to ``end`` (epoch seconds; a request never names "user")."""

    op: ClassVar[str] = "reserve_add"
    for_user: str
    gpus: int
    start: float
    end: float
    node: str | None = None


@dataclass(frozen=True)
class ReserveListRequest(Request[list[ReservationView]]):
    op: ClassVar[str] = "reserve_list"


@dataclass(frozen=True)
class ReserveDeleteRequest(Request[ReservationView]):
    op: ClassVar[str] = "reserve_delete"
    id: int

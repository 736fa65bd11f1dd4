"""Immutable snapshots of the cluster's GPUs, as the poller saw them at one instant.

Snapshots are plain frozen dataclasses so that the poller, the scheduler (a pure function of a
snapshot), the store (which serialises them as JSON) and the TUI all share one vocabulary.
A metric the GPU or driver does not report is ``None`` ("not available"), never a made-up zero.
An unreachable node is a ``NodeSnapshot`` with ``error`` set, never an exception.
"""
from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on a GPU; ``job_id`` is set when iadeep launched it, else foreign.
    ``sm_util``, ``mem_util``: its share of the GPU's SM time and of its memory interface's (%),
    where the poll sees them (NVML on the controller's own machine, ``nvidia-smi pmon`` over
    SSH; None where the driver has no sample of the process or does not support it, as in MIG
    mode)."""

    pid: int
    used_memory_mib: float | None
    name: str = ""
    job_id: int | None = None
    sm_util: float | None = None
    mem_util: float | None = None

    @property
    def foreign(self) -> bool:
        return self.job_id is None


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant. Fields the driver lacks are ``None``."""

    index: int
    uuid: str
    name: str
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    memory_free_mib: float | None = None
    utilization_gpu: float | None = None
    utilization_memory: float | None = None
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def free_mib(self) -> float | None:
        """Free memory, derived from total-used when the driver did not report free directly."""
        if self.memory_free_mib is not None:
            return self.memory_free_mib
        if self.memory_total_mib is not None and self.memory_used_mib is not None:
            return self.memory_total_mib - self.memory_used_mib
        return None

    @property
    def foreign_processes(self) -> tuple[GpuProcess, ...]:
        return tuple(p for p in self.processes if p.foreign)


class RemoteState(str, enum.Enum):
    """What a node's backend says of one job (``RemoteJob.state``; see there)."""

    RUNNING = "running"
    EXITED = "exited"
    MISSING = "missing"
    CLAIMED = "claimed"
    PENDING = "pending"
    UNKNOWN = "unknown"

    def __str__(self) -> str:  # so f-strings print 'running', not 'RemoteState.RUNNING'
        return self.value


# An exited job's RemoteJob.reason when it asked to be requeued (a shell node's `scontrol
# requeue`, nodes/shell/slurm_in_job.py): the controller queues it again instead of ending it.
REQUEUE_ASKED = "requeue"
# ... when its memory cgroup killed something of it: it went over its --mem (host RAM) limit
MEM_LIMIT = "mem-limit"


@dataclass(frozen=True)
class RemoteJob:
    """What a job's session and directory on its node say.

    ``state``: running (its session leader is alive and is ours) | exited (the leader is gone;
    ``exit_code`` from the exit file, None when there is none: killed hard, node rebooted) |
    missing (no pid file and no launch claim: never started) | claimed (a launch claimed the
    directory but recorded no pid: interrupted; whether it started is unknown) | unknown (the
    node answered, but its part of the poll that reads this job could not run: on a
    ``run_as: submitter`` node, sudo or the owner's account failed; the job is left as it is).
    ``start``: the leader's start time (clock ticks since boot), reported for running jobs so
    that a pid reused after a reboot is never mistaken for the job.
    pending (Slurm only: submitted, ``pid`` its Slurm job id, but Slurm has not started it;
    ``reason`` is Slurm's, e.g. ``Resources`` or ``JobHeldUser``): the job stays ``starting``,
    so it is not counted as running before it runs.
    """

    state: RemoteState
    exit_code: int | None = None
    pid: int | None = None
    start: int | None = None
    reason: str | None = None

    def __post_init__(self) -> None:   # a stored snapshot gives the state as its string
        object.__setattr__(self, "state", RemoteState(self.state))


@dataclass(frozen=True)
class NodeSnapshot:
    """One node at one poll: its GPUs and its jobs, or the reason they could not be read.

    ``error`` says why there is no GPU data; ``jobs`` is None when the node did not answer at
    all, else the state of every job the controller expects there (``(job id, RemoteJob)``).
    The two differ on purpose: a node whose nvidia-smi fails still answers over SSH, and its
    jobs are still known to be running; only a node that does not answer can lose its jobs.
    """

    name: str
    taken_at: float
    gpus: tuple[GpuSample, ...] = ()
    error: str | None = None
    driver_version: str | None = None
    rtt_s: float | None = None
    jobs: tuple[tuple[int, RemoteJob], ...] | None = None
    # What this poll read of its running jobs' progress files: (job id, offset the text starts
    # at, the file's size, the text).  For this round's speeds only: never stored or shown.
    progress: tuple[tuple[int, int, int, str], ...] = field(default=(), repr=False)
    # The running jobs whose progress files this poll was asked to read: its answer covers
    # them, new bytes or none (a late answer covers what its own round asked). The round's alone.
    progress_asked: tuple[int, ...] = field(default=(), repr=False)
    # Why placement leaves this node out this round although its GPUs were read (its launches
    # keep failing: the controller's schedule step sets it). The round's alone, like progress.
    closed: str | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        """GPU data is usable."""
        return self.error is None

    @property
    def placeable(self) -> bool:
        """Placement may use this node: its GPU data is usable and nothing closed it."""
        return self.error is None and self.closed is None

    @property
    def reached(self) -> bool:
        """The node answered this poll (its jobs' states are known)."""
        return self.jobs is not None

    def job(self, job_id: int) -> RemoteJob | None:
        return dict(self.jobs or ()).get(job_id)


@dataclass(frozen=True)
class ClusterSnapshot:
    """All nodes from one poll cycle."""

    taken_at: float
    nodes: tuple[NodeSnapshot, ...] = field(default_factory=tuple)

    def node(self, name: str) -> NodeSnapshot | None:
        return self._by_name.get(name)

    def gpu(self, node: str | None, index: int) -> GpuSample | None:
        """GPU ``index`` of ``node`` as last read; None if the node failed or has no such GPU."""
        return self._by_gpu.get((node or "", index))

    # Looked up once per job and step every round: indexed on first use (a snapshot is frozen).
    @functools.cached_property
    def _by_name(self) -> dict[str, NodeSnapshot]:
        out: dict[str, NodeSnapshot] = {}
        for n in self.nodes:
            out.setdefault(n.name, n)   # the first of a name, as a scan would find
        return out

    @functools.cached_property
    def _by_gpu(self) -> dict[tuple[str, int], GpuSample]:
        out: dict[tuple[str, int], GpuSample] = {}
        for n in self._by_name.values():
            for g in n.gpus if n.ok else ():
                out.setdefault((n.name, g.index), g)
        return out


def json_safe(data: Any) -> Any:
    """``data`` with every non-finite float (NaN, +-Infinity) as None ("not available"), so it
    dumps as standard JSON (``allow_nan=False``): a database written before values were
    validated, or a ratio of nothing, must not print what strict parsers reject."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


# a node's fields that are the round's alone
_ROUND_ONLY = ("progress", "progress_asked", "closed")


def to_dict(obj: Any) -> dict:
    """Serialise a snapshot (any of the classes above) to plain JSON-able data (a node's
    ``progress``, ``progress_asked`` and ``closed`` are the round's alone, and left out:
    skipped before they are copied, since ``progress`` holds every running job's new
    bytes)."""
    return _plain(obj)


# each dataclass's fields to serialise, found once per class (a round serialises every
# running job's entry of every node: asking ``dataclasses.fields`` each time cost most of it)
_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(value: Any) -> Any:
    """``dataclasses.asdict``'s result for these classes (their values are immutable: no
    copies), without the round-only fields."""
    kind = type(value)
    if kind in (str, int, float, bool) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return kind(_plain(v) for v in value)
    names = _NAMES.get(kind)
    if names is None and is_dataclass(value) and not isinstance(value, type):
        names = _NAMES[kind] = tuple(f.name for f in fields(value)
                                     if f.name not in _ROUND_ONLY)
    if names is not None:
        return {name: _plain(getattr(value, name)) for name in names}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def gpu_from_dict(d: dict) -> GpuSample:
    procs = tuple(GpuProcess(**p) for p in d.get("processes", ()))
    return GpuSample(**{**d, "processes": procs})


def node_from_dict(d: dict) -> NodeSnapshot:
    jobs = d.get("jobs")
    return NodeSnapshot(**{**d, "gpus": tuple(gpu_from_dict(g) for g in d.get("gpus", ())),
                           "jobs": None if jobs is None else
                           tuple((int(i), RemoteJob(**r)) for i, r in jobs)})


def cluster_from_dict(d: dict) -> ClusterSnapshot:
    return ClusterSnapshot(d["taken_at"], tuple(node_from_dict(n) for n in d.get("nodes", ())))

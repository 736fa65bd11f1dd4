"""Who may start more work in a round, for ``placement.plan()`` and ``sharing.Pressure``: pure.

- A user's limits (``users:`` in the inventory: ``max_gpus``, ``max_jobs``) count what their
  jobs on GPUs hold now (``Usage``): each GPU once, however many of their jobs share it.
- An array's ``--array ...%N``: at most N of its tasks on GPUs at once.

A job over either waits with the reason these give; ``plan()`` charges each job it starts to
its owner (``charge``) so later jobs in the same round see it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..jobs import Job, parse_array
from ..settings import UserLimit

# Per owner: the GPUs their jobs hold (each once: (node, index), or a stand-in while a job's
# GPUs are not known yet) and how many jobs they run.
Usage = dict[str, tuple[frozenset[tuple[Any, ...]], int]]


def usage_of(active: Sequence[Job]) -> Usage:
    """Per owner: the GPUs their jobs hold, each counted once (jobs sharing a GPU use one GPU,
    not one each), and how many jobs."""
    usage: Usage = {}
    for j in active:
        charge(usage, j.owner, {(j.node, i) for i in j.gpu_indices}
               or {("?", j.id, k) for k in range(max(1, j.spec.gpus))})   # not known yet
    return usage


def array_limit_reason(job: Job, tasks_active: Mapping[int, int]) -> str | None:
    """``--array ...%N``: at most N of the array's tasks on GPUs at once (starting or
    running; a lost task is not counted, its node is silent)."""
    if job.array_id is None or job.spec.array is None:
        return None
    limit = parse_array(job.spec.array).limit
    running = tasks_active.get(job.array_id, 0)
    if limit is None or running < limit:
        return None
    return (f"array {job.array_id}: {running} of its tasks running, at most {limit} at once "
            f"(--array %{limit})")


def user_limit_reason(job: Job, usage: Mapping[str, tuple[frozenset[tuple[Any, ...]], int]],
                      limits: Mapping[str, UserLimit]) -> str | None:
    """``users:`` limits: the owner's GPUs in use plus this job's over ``max_gpus``, or one
    more job over ``max_jobs``."""
    lim = limits.get(job.owner)
    if lim is None:
        return None
    held, jobs = usage.get(job.owner, (frozenset(), 0))
    gpus = len(held)
    if lim.max_gpus is not None and gpus + job.spec.gpus > lim.max_gpus:
        plural = "s" if lim.max_gpus != 1 else ""
        return (f"user limit: {job.owner} may use {lim.max_gpus} GPU{plural} at once; "
                f"{gpus} in use, this job needs {job.spec.gpus}")
    if lim.max_jobs is not None and jobs + 1 > lim.max_jobs:
        return f"user limit: {job.owner} already runs {jobs} of {lim.max_jobs} jobs"
    return None


def charge(usage: Usage, owner: str, gpus: Iterable[tuple[Any, ...]]) -> None:
    """Count one more job of ``owner`` holding ``gpus`` ((node, index) pairs) in ``usage``."""
    held, jobs = usage.get(owner, (frozenset(), 0))
    usage[owner] = (held | set(gpus), jobs + 1)

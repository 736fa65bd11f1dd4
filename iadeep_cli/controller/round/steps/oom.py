"""Out of GPU memory, named: a job that died of a CUDA out-of-memory error says so.

When a job exits non-zero, the last lines of its log (``TAIL_BYTES``, read through its node as
`iadeep logs` reads it) are searched for what the frameworks print when CUDA runs out of memory
(PyTorch's ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...``, the CUDA
driver's and runtime's error names, cuBLAS's and XLA's). Such a job fails with the reason "out
of GPU memory", and, when other jobs were on its GPU, "while sharing GPU node:i with job N
(workload)". A job that ran out of memory *beside* others was placed badly, not written badly:

- with ``--retries`` left it is requeued (even without ``--retry-on-fail``) and runs alone from
  then on: its ``exclusive`` flag is set, which `queue show` shows;
- the pair is recorded as a co-location at ``UNSAFE_SPEED`` for both, with the jobs that really
  shared the GPU with it (``partners``); the row is its owner's word alone, held as theirs until
  another member's job runs out of memory in the same pair or an admin adopts it
  (``store/profiles.add_colocation``); from then on the model, at its next refit, predicts the
  pair far below any floor and never places it together again.

Nothing here runs for a job that exited 0, was cancelled, or has no log on its node.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from ....errors import IadeepError
from ....jobs import Job, JobState
from ....profiles import CoLocation
from ....store import cluster, jobrows, profiles as profrows
from ....text import gpus_at

if TYPE_CHECKING:
    from ..context import Context  # the controller's shared parts

log = logging.getLogger("iadeep.controller")
TAIL_BYTES = 8192     # the end of the log that is searched (a Python traceback ends there)
TAIL_LINES = 40
REASON = "out of GPU memory"
UNSAFE_SPEED = 0.05   # what a pair that ran out of memory is recorded at (model's MIN_SPEED)
# A partner that ended this long before the job is still counted (both may die in one round).
RECENT_S = 120.0
PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|RESOURCE_EXHAUSTED: Out of memory"
    r"|out of memory while trying to allocate", re.IGNORECASE)


def is_oom(tail: str) -> bool:
    """Whether the log's last lines show a CUDA out-of-memory error."""
    lines = tail.rstrip("\n").split("\n")[-TAIL_LINES:]
    return any(PATTERNS.search(line) for line in lines)


def read_tail(loop: Context, job: Job) -> str | None:
    """The end of the job's log (stderr's file when it has its own), or None if unreadable."""
    if job.node is None:
        return None
    stream = "error" if job.spec.error else "output"
    try:
        backend = loop.pool.backend(job.node)
        size = backend.read_log(job.id, 0, 1, owner=job.owner, job=job, stream=stream).size or 0
        start = max(0, size - TAIL_BYTES)
        data = backend.read_log(job.id, start, TAIL_BYTES, owner=job.owner, job=job,
                                stream=stream).data
    except (IadeepError, OSError) as exc:
        log.info("job %d: its log's tail could not be read (%s)", job.id, exc)
        return None
    return data.decode("utf-8", "replace")


def partners(loop: Context, job: Job, now: float) -> list[Job]:
    """The other jobs that shared the job's GPUs while it ran: started there before now and
    still running there (or suspended), or failed there in the last ``RECENT_S`` after the job
    started (both may die in one round). A job that ended before this one started, or that
    has not started yet, shared nothing with it, whoever owns it."""
    if job.node is None or not job.gpu_indices or job.started_at is None:
        return []
    with loop.store.tx() as conn:
        near = jobrows.select(conn, node=job.node)
    mine, began = set(job.gpu_indices), job.started_at
    return [j for j in near if j.id != job.id and mine & set(j.gpu_indices)
            and j.started_at is not None and j.started_at <= now
            and (j.state in (JobState.RUNNING, JobState.SUSPENDED)
                 or (j.state is JobState.FAILED and j.ended_at is not None
                     and now - j.ended_at <= RECENT_S and j.ended_at >= began))]


def reason(job: Job, code: int, others: list[Job]) -> str:
    """'out of GPU memory (exit code 1) while sharing GPU n1:0 with job 7 (mlp)'."""
    text = f"{REASON} (exit code {code})"
    if others:
        names = ", ".join(f"job {o.id} ({o.spec.workload or o.name})" for o in others)
        text += f" while sharing GPU {gpus_at(job.node, job.gpu_indices)} with {names}"
    return text


def learn(loop: Context, job: Job, others: list[Job], now: float) -> int:
    """Record each pair (job, partner) of known workloads as unsafe; how many were recorded."""
    if not job.spec.workload:
        return 0
    with loop.store.tx() as conn:
        snapshot = cluster.load_cluster(conn)
        gpu = snapshot.gpu(job.node or "", job.gpu_indices[0]) if snapshot else None
        count = 0
        for other in others:
            if other.spec.workload:
                # the job's owner's word alone (its log said so): held as theirs until
                # another member's job runs out of memory in the same pair, or an admin
                # adopts it (store/profiles.py)
                profrows.add_colocation(conn, CoLocation(
                    gpu.name if gpu else "", (job.spec.workload, other.spec.workload),
                    (UNSAFE_SPEED, UNSAFE_SPEED)), now, owners=(job.owner,),
                    note=f"job {job.id} ({job.owner}) ran out of GPU memory beside job "
                         f"{other.id} ({other.owner})")
                count += 1
    return count


def named(loop: Context, job: Job, code: int, why: str,
          learnt: Callable[[int], None]) -> tuple[str, bool]:
    """(the failure's reason, whether to requeue it even without --retry-on-fail): for a job
    that ran out of GPU memory, that reason; if it shared, it is marked to run alone next, and
    ``learnt`` gets the number of unsafe pairs recorded (the model's next refit learns them)."""
    if code == 0 or not is_oom(read_tail(loop, job) or ""):
        return why, False
    now = loop.clock()
    others = partners(loop, job, now)
    text = reason(job, code, others)
    if not others:
        return text, False
    learnt(learn(loop, job, others, now))
    with loop.store.tx() as conn:
        jobrows.update(conn, job.id, exclusive=True)
    log.warning("job %d (%s): %s; it runs alone from now on", job.id, job.owner, text)
    return f"{text}; runs alone from now on", True

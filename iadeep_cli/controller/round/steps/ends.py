"""How an attempt ends: it never started, it exited, or it is requeued (``Ends``).

Shared by the steps that find an attempt over: reconcile (the poll says so), lose (an admin
fenced its node) and launch (the node refused to start it).
"""
from __future__ import annotations

from collections.abc import Callable

from ....errors import IadeepError
from ....jobs import Job, JobState, StopReason
from ....snapshot import MEM_LIMIT, REQUEUE_ASKED
from ....text import hms
from ...jobfault import guarded
from ..context import Context, Step
from . import idle, oom
from .adaptation import Adapter
from .backoff import Backoff


class Ends(Step):
    def __init__(self, ctx: Context, adapt: Adapter, launch_health: Backoff,
                 forget: Callable[[int], None], learnt: Callable[[int], None]):
        super().__init__(ctx)
        self._learnt = learnt   # co-locations recorded here (out of GPU memory): steps/observe
        self.adapt = adapt   # steps/adaptation.Adapter: a checkpointed job is requeued there
        self._launch_health = launch_health
        self._forget = forget   # drop a job's profiling samples (steps/profile.py)

    def not_started(self, job: Job) -> None:
        """A launch that provably never started: cancelled if that was asked, else queued
        again without spending one of its retries."""
        if job.stop_reason is not None:
            self.move(job, JobState.CANCELLED, f"{stopped(job)[1]} before it started",
                       ended_at=self.clock())
            return
        why = "launch did not happen; back in the queue"
        health = self._launch_health.get(job.node or "")
        if health is not None and health.until > self.clock():
            why = (f"launch on {job.node} failed ({health.reason}); back in the queue, "
                   f"{job.node} is skipped for {health.until - self.clock():.0f} s")
        self.ctx.requeue(job, why, started=False)

    def finish(self, job: Job, code: int | None, said: str | None = None) -> None:
        """The attempt ended with exit ``code``; ``said``: the backend's word on it (the
        RemoteJob's reason: ``REQUEUE_ASKED`` when the job asked to be requeued)."""
        now = self.clock()
        if job.checkpoint_at is not None and self.adapt.checkpointed(job, code):
            return   # it checkpointed on its --checkpoint-signal: queued again
        if said == REQUEUE_ASKED and job.stop_reason is None and job.state in (
                JobState.RUNNING, JobState.SUSPENDED, JobState.STARTING):
            # its own `scontrol requeue` (a shell node's, nodes/shell/slurm_in_job.py): queued
            # again without spending a retry, as a checkpoint, in the same working directory
            self.ctx.requeue(job, f"it asked to be requeued (scontrol requeue; exit code "
                             f"{code}); back in the queue (attempt {job.attempts + 1} next)",
                             started=True, checkpoints=job.checkpoints + 1)
            self._forget(job.id)
            return
        if idle.requeued(self.ctx, job):   # stopped for idleness with idle_action: requeue
            return
        if job.stop_reason is not None:
            new, why = stopped(job)
        elif code == 0:
            new, why = JobState.SUCCEEDED, "exited with code 0"
        elif code is None:
            if self.requeue(job, f"its attempt on {job.node} ended without an exit code "
                                 "(killed, or the node rebooted)"):
                return
            new, why = JobState.FAILED, "ended without an exit code (killed or node rebooted)"
        elif said == MEM_LIMIT:
            new, why = JobState.FAILED, (
                f"went over its host memory limit (--mem {job.spec.host_mem_mib}M): the "
                f"node's memory cgroup stopped it (exit code {code})")
        else:
            # what the job wrote (its log) names its failure, or fails only that naming
            why = guarded(job, "failure naming", None, self._open_failure, job, code) \
                or f"exited with code {code}"
            # out of GPU memory beside another job: named, learnt, and retried alone (oom.py)
            why, alone = guarded(job, "out-of-memory naming", (why, False), oom.named,
                                 self.ctx, job, code, why, self._learnt)
            if (alone or job.spec.retry_on_fail) and self.requeue(job, why):
                return
            new = JobState.FAILED
        self._forget(job.id)
        self.move(job, new, why, exit_code=code, ended_at=now, started_at=job.started_at or now)

    def _open_failure(self, job: Job, code: int) -> str | None:
        """Why a job whose --output/--error could not be opened failed: the shell's message,
        which the wrapper wrote to the job directory's log (read only for its exit code)."""
        from ....nodes.backend import OPEN_FAILED, OPEN_FAILED_LINE

        if code != OPEN_FAILED or job.node is None or not (job.spec.output
                                                                     or job.spec.error):
            return None
        try:
            data = self.pool.backend(job.node).read_log(job.id, 0, 4096, owner=job.owner).data
        except IadeepError:
            return None
        line = next((x for x in data.decode("utf-8", "replace").splitlines()
                     if x.startswith(OPEN_FAILED_LINE)), None)
        said = None if line is None else line[len(OPEN_FAILED_LINE):][:300]
        files = "its output" if not job.spec.error else \
            "its error file" if not job.spec.output else "its output or error file"
        return said and f"could not open {files} (exit code {code}): {said}"

    def requeue(self, job: Job, why: str) -> bool:
        """Queue a job's next attempt, if it has retries left; its previous attempt must be
        known dead or fenced.  The old attempt's node is remembered (an orphan): its directory
        is set aside, and anything of it still running stopped, before a new attempt may start
        there (else the new launch would find the old pid file)."""
        if job.attempts - job.checkpoints > job.spec.retries:   # checkpoints spend no retry
            return False
        if job.state != JobState.LOST:
            job = self.move(job, JobState.LOST, why)
        self.ctx.requeue(job, f"{why}; requeued (attempt {job.attempts + 1} of "
                         f"{job.spec.retries + 1} next)", started=True)
        self._forget(job.id)
        return True


def stopped(job: Job) -> tuple[JobState, str]:
    """The end of a job that was asked to stop (``Job.stop_reason``): the state it leads to,
    and why: cancelled by a person, timed out, its --pty client gone, or cancelled for
    idleness."""
    reason = job.stop_reason or StopReason.CANCELLED
    if reason is StopReason.TIME_LIMIT:
        why = f"time limit {hms(job.spec.time_limit_s)} reached"
    elif reason is StopReason.CANCELLED:
        why = f"cancelled by {job.cancel_requested_by}"
    elif reason is StopReason.CLIENT_GONE:
        why = ("cancelled: its `iadeep run --pty` client had gone (not heard from for longer "
               "than lab.interactive_grace)")
    else:   # idle, lab.idle_action cancel (or requeue, where it could not be queued again)
        why = "cancelled for idleness (lab.idle_action)"
    return reason.to_state(), why

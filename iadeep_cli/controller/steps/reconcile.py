"""Step: bring every job on a node that answered in line with what its poll says.

This runs before anything is decided, so a restarted controller never starts a job that is
already running: a launch committed as ``starting`` is found running (its pid file) or not
started (nothing: queued again). A job with an action in flight is left alone until it is done.
"""
from __future__ import annotations

import logging

from ...errors import IadeepError
from ...jobs import ACTIVE, Job, JobState
from ...store import jobrows
from ..jobfault import guarded
from .context import Context, Step
from .ends import Ends

log = logging.getLogger("iadeep.controller")


class Reconcile(Step):
    def __init__(self, ctx: Context, ends: Ends):
        super().__init__(ctx)
        self.ends = ends

    def run(self, node) -> None:
        """Bring every job we think is on ``node`` in line with what its poll says.

        A job with an action in flight, or whose action ended after this poll began, is left
        for the next round: the poll may predate what the action did (a launch completing)."""
        for job in self.jobs(ACTIVE | {JobState.LOST, JobState.HELD}, node.name):
            if self.actions.busy(job.id) or self.actions.acted_at(job.id) >= node.taken_at:
                continue
            # what the job's files on the node said (its exit file) fails only this job
            apply = self._apply_held if job.state == JobState.HELD else self._apply_remote
            guarded(job, "reconcile", None, apply, job, node.job(job.id))

    def _apply_held(self, job: Job, remote) -> None:
        """A held job that Slurm has (it was `starting`, pending there, when it was held):
        iadeep's `held` is what must be, so Slurm is made to hold it (``scontrol hold``, again
        each round until the poll says so: idempotent, and a crash in between is repaired).
        Slurm started it before the hold reached it: it runs, and says so. Its Slurm job gone
        (cancelled there, or never submitted): it stays held, placed anew once released."""
        if remote is None or remote.state == "unknown":
            return   # Slurm did not answer: nothing is known
        if remote.state == "pending":
            if not self.pool.backend(job.node or "").is_held(remote):
                self._slurm_hold(job, True)
        elif remote.state == "running":   # back to starting, then running as any start
            job = self.move(job, JobState.STARTING, "not held: Slurm had started it before "
                             "the hold reached it")
            self._apply_remote(job, remote)
        elif job.cancel_requested_by and remote.state == "exited":
            self.ends.finish(job, remote.exit_code)
        else:   # no Slurm job (any more): an ordinary held job
            with self.store.tx() as conn:
                jobrows.update(conn, job.id, **jobrows.no_attempt())

    def _slurm_hold(self, job: Job, held: bool) -> None:
        """``scontrol hold``/``release`` of the job's pending Slurm job, on its node's worker."""
        def act() -> None:
            try:
                backend = self.pool.backend(job.node or "")
                (backend.hold if held else backend.release)(job.id, owner=job.owner)
            except IadeepError as exc:
                log.warning("%s job %s in Slurm failed: %s", "holding" if held else "releasing",
                            job.id, exc.message)
        self.actions.submit(job.node or "", ("hold" if held else "release", job.id), act)

    def _apply_remote(self, job: Job, remote) -> None:
        now = self.clock()
        if remote is not None and remote.state == "unknown":
            return   # nobody could look (its owner's sudo failed): nothing is known, or changed
        if remote is None or remote.state == "missing":
            if job.state == JobState.STARTING or (job.state == JobState.LOST
                                                  and job.remote_pid is None):
                self.ends.not_started(job)   # the launch never happened
        elif remote.state == "claimed":
            if job.state != JobState.LOST:
                self.move(job, JobState.LOST, f"its launch on {job.node} was interrupted; "
                           "whether it started is unknown (check the node, then cancel it)")
        elif remote.state == "pending":
            # Slurm has it but has not started it: still `starting` (it holds its place on the
            # GPU iadeep chose), with Slurm's reason for `queue show/why`; running only once
            # squeue says RUNNING
            if job.state == JobState.STARTING and self.pool.backend(job.node or "").is_held(remote):
                self._slurm_hold(job, False)   # iadeep says it should start (released)
            if job.state == JobState.STARTING:
                why = f"submitted to Slurm as job {remote.pid}; waiting for Slurm " \
                      f"({remote.reason or 'pending'})"
                if job.reason != why or job.remote_pid != remote.pid:
                    with self.store.tx() as conn:
                        jobrows.update(conn, job.id, reason=why, remote_pid=remote.pid)
        elif remote.state == "running":
            if job.state == JobState.SUSPENDED:
                return   # stopped on purpose; controller/adaptation.py resumes it
            if job.state != JobState.RUNNING or job.remote_pid is None:
                why = "node answers again" if job.state == JobState.LOST else \
                    f"running on {job.node}:{','.join(map(str, job.gpu_indices))}" \
                    f"{self._run_dir(job)}"
                self.move(job, JobState.RUNNING, why, remote_pid=remote.pid,
                           remote_start=remote.start, started_at=job.started_at or now)
        else:  # exited
            self.ends.finish(job, remote.exit_code)

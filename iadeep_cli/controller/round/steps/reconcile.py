"""Step: bring every job on a node that answered in line with what its poll says.

This runs before anything is decided, so a restarted controller never starts a job that is
already running: a launch committed as ``starting`` is found running (its pid file) or not
started (nothing: queued again). A job with an action in flight is left alone until it is done.
"""
from __future__ import annotations

import logging

from ....errors import IadeepError
from ....jobs import ACTIVE, Job, JobState
from ....nodes.backend import features
from ....snapshot import NodeSnapshot, RemoteJob, RemoteState
from ....store import jobrows
from ....text import gpus_at
from ...jobfault import guarded
from ..context import Context, Round, Step
from .clean import Clean
from .ends import Ends

log = logging.getLogger("iadeep.controller")


class Reconcile(Step):
    def __init__(self, ctx: Context, ends: Ends, clean: Clean):
        super().__init__(ctx)
        self.ends = ends
        self.clean = clean   # each answering node's abandoned attempts (steps/clean.py)

    def run(self, r: Round) -> None:
        """Each node that answered: its jobs in line with its poll, then its abandoned attempts
        stopped and set aside."""
        for node in r.snapshot.nodes:
            if node.reached:
                self.node(node)
                self.clean.orphans(node.name)

    def node(self, node: NodeSnapshot) -> None:
        """Bring every job we think is on ``node`` in line with what its poll says.

        A job with an action in flight, or whose action ended after this poll began, is left
        for the next round: the poll may predate what the action did (a launch completing)."""
        for job in self.jobs(ACTIVE | {JobState.LOST, JobState.HELD}, node.name):
            if self.actions.busy(job.id) or self.actions.acted_at(job.id) >= node.taken_at:
                continue
            # what the job's files on the node said (its exit file) fails only this job
            apply = self._apply_held if job.state == JobState.HELD else self._apply_remote
            guarded(job, "reconcile", None, apply, job, node.job(job.id))

    def _label(self, job: Job) -> str:
        """How messages name the backend of the job's node ("Slurm")."""
        return features(self.pool.backend(job.node or "").kind).label

    def _apply_held(self, job: Job, remote: RemoteJob | None) -> None:
        """A held job that its backend's queue has (it was `starting`, pending there, when it
        was held; ``Backend.keeps_jobs_pending``): iadeep's `held` is what must be, so the
        queue is made to hold it (``Backend.hold``, again each round until the poll says so:
        idempotent, and a crash in between is repaired). Started there before the hold reached
        it: it runs, and says so. Gone from that queue (cancelled there, or never submitted):
        it stays held, placed anew once released."""
        if remote is None or remote.state == RemoteState.UNKNOWN:
            return   # the backend's queue did not answer: nothing is known
        if remote.state == RemoteState.PENDING:
            if not self.pool.backend(job.node or "").is_held(remote):
                self._hold(job, True)
        elif remote.state == RemoteState.RUNNING:   # back to starting, then running as any start
            job = self.move(job, JobState.STARTING, f"not held: {self._label(job)} had started "
                             "it before the hold reached it")
            self._apply_remote(job, remote)
        elif job.stop_reason and remote.state == RemoteState.EXITED:
            self.ends.finish(job, remote.exit_code, remote.reason)
        else:   # not in the backend's queue (any more): an ordinary held job
            with self.store.tx() as conn:
                jobrows.update(conn, job.id, **jobrows.no_attempt())

    def _hold(self, job: Job, held: bool) -> None:
        """``Backend.hold``/``release`` of the job pending in its backend's queue, on its node's
        worker."""
        def act() -> None:
            try:
                backend = self.pool.backend(job.node or "")
                (backend.hold if held else backend.release)(job.id, owner=job.owner)
            except IadeepError as exc:
                log.warning("%s job %s in %s failed: %s", "holding" if held else "releasing",
                            job.id, features(backend.kind).label, exc.message)
        self.actions.submit(job.node or "", ("hold" if held else "release", job.id), act)

    def _apply_remote(self, job: Job, remote: RemoteJob | None) -> None:
        now = self.clock()
        if remote is not None and remote.state == RemoteState.UNKNOWN:
            return   # nobody could look (its owner's sudo failed): nothing is known, or changed
        if remote is None or remote.state == RemoteState.MISSING:
            if job.state == JobState.STARTING or (job.state == JobState.LOST
                                                  and job.remote_pid is None):
                self.ends.not_started(job)   # the launch never happened
        elif remote.state == RemoteState.CLAIMED:
            if job.state != JobState.LOST:
                self.move(job, JobState.LOST, f"its launch on {job.node} was interrupted; "
                           "whether it started is unknown (check the node, then cancel it)")
        elif remote.state == RemoteState.PENDING:
            # its backend's queue has it but has not started it: still `starting` (it holds its
            # place on the GPU iadeep chose), with the queue's reason for `queue show/why`;
            # running only once the poll says it runs
            if job.state == JobState.STARTING and self.pool.backend(job.node or "").is_held(remote):
                self._hold(job, False)   # iadeep says it should start (released)
            if job.state == JobState.STARTING:
                label = self._label(job)
                why = f"submitted to {label} as job {remote.pid}; waiting for {label} " \
                      f"({remote.reason or 'pending'})"
                if job.reason != why or job.remote_pid != remote.pid:
                    with self.store.tx() as conn:
                        jobrows.update(conn, job.id, reason=why, remote_pid=remote.pid)
        elif remote.state == RemoteState.RUNNING:
            if job.state == JobState.SUSPENDED:
                return   # stopped on purpose; controller/round/steps/adaptation.py resumes it
            if job.state != JobState.RUNNING or job.remote_pid is None:
                why = "node answers again" if job.state == JobState.LOST else \
                    f"running on {gpus_at(job.node, job.gpu_indices)}" \
                    f"{self._run_dir(job)}"
                self.move(job, JobState.RUNNING, why, remote_pid=remote.pid,
                           remote_start=remote.start, started_at=job.started_at or now)
        else:  # exited
            self.ends.finish(job, remote.exit_code, remote.reason)

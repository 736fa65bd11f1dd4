"""Run-time adaptation, the acting half: what the controller does about a shared GPU gone wrong.

``scheduler/adapt.py`` decides (pure); this module feeds it each round's observed speeds and
acts, every action an event with the numbers that caused it (``queue show``, ``queue why``):

1. **No new partners**: a GPU with a finding goes to ``plan(closed=...)``, so no job joins it;
   its jobs get an event (running -> running) and their ``queue why`` says so.
2. **Suspend and resume**: a GPU running worse than serial gets the job that joined last
   suspended (``suspended``, SIGSTOP to its process group; its GPU memory stays), and resumed
   (SIGCONT, ``running``) once the partner it was suspended for is no longer on that GPU.

Crash safety, as for launches (intent before action): a suspension is committed (state
``suspended``, ``suspended_at``, ``suspended_for``) before the SIGSTOP is sent on the node's
worker; a resumption sends SIGCONT *before* it commits ``running``. ``suspended_at`` is cleared
only once a SIGCONT went through. So after any crash the database says suspended (or has
``suspended_at`` set) for every job that may be stopped, and every round re-derives what must
be: a suspended job whose partner is gone (or whose lab turned suspension off) is resumed; one
whose partner is still there gets its SIGSTOP again (idempotent) once per controller process;
a running job that still has ``suspended_at`` (lost while suspended, then seen running) gets a
SIGCONT. No job is stopped forever, and nothing is started or ended twice: only signals repeat.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Protocol

from ..errors import IadeepError, InvalidTransition
from ..inventory import Inventory
from ..jobs import ACTIVE, Job, JobState
from ..scheduler.adapt import Detector, Finding, Sharer, closed_gpus, last_joined
from ..store import Store, jobs as jobrows

log = logging.getLogger("iadeep.controller")
ACTOR = "controller"


class Host(Protocol):
    """What the adapter needs of the scheduling loop (``controller/loop.SchedulingLoop``; a
    protocol so this module need not import the loop, which imports it)."""

    store: Store
    inventory: Inventory
    pool: Any
    actions: Any
    clock: Callable[[], float]

    def _jobs(self, states: Iterable[JobState], node: str | None = None) -> list[Job]: ...

    def _move(self, job: Job, new: JobState, reason: str, **fields: Any) -> Job: ...


class Adapter:
    """Owned by the loop; ``step`` once a round after the speeds are observed, ``closed`` for
    ``plan()``."""

    def __init__(self, loop: Host):
        self.loop = loop
        self.detector = Detector()
        self.findings: dict[str, Finding] = {}
        self._announced: set[tuple] = set()   # (gpu, jobs, kinds) already given an event
        self._stop_sent: set[int] = set()     # SIGSTOP delivered by this controller process
        self._lock = threading.Lock()

    @property
    def policy(self):
        return self.loop.inventory.policy.adapt

    # ------------------------------------------------------------------ the round
    def step(self, now: float, speeds: dict[int, float]) -> None:
        """Detect on this round's ``speeds`` (job id -> observed speed) and act."""
        jobs = self.loop._jobs(ACTIVE)
        self._recover(jobs, now)
        policy = self.policy
        if not policy.enabled:
            self.findings = {}
            return
        gpus = {name: [_sharer(j, speeds) for j in group]
                for name, group in _shared(jobs).items()}
        self.findings = self.detector.observe(now, gpus, policy)
        by_id = {j.id: j for j in jobs}
        for gpu, finding in self.findings.items():
            key = (gpu, finding.job_ids, finding.kinds)
            if key not in self._announced:
                self._announced.add(key)
                self._announce(finding, now)
            if finding.worse_than_serial and policy.suspend:
                victim = last_joined(gpus[gpu])
                if victim is not None and by_id[victim.job_id].state == JobState.RUNNING:
                    partner = next(s.job_id for s in gpus[gpu] if s.job_id != victim.job_id)
                    self._suspend(by_id[victim.job_id], partner, finding, now)
        live = {(g, f.job_ids, f.kinds) for g, f in self.findings.items()}
        self._announced &= live

    def closed(self, now: float) -> dict[str, str]:
        return closed_gpus(self.findings, now, self.policy)

    # ------------------------------------------------------------------ act 1
    def _announce(self, finding: Finding, now: float) -> None:
        """One event per job of the GPU, with the numbers (``queue show``), and the reason
        ``queue why`` prints."""
        what = finding.describe(now)
        acts = []
        if self.policy.stop_partners:
            acts.append("no new partners join it")
        if finding.worse_than_serial and self.policy.suspend:
            acts.append("the job that joined last is suspended")
        why = f"adapt: {what}" + (f"; {', '.join(acts)}" if acts else "")
        log.warning("%s", why)
        with self.loop.store.tx() as conn:
            for job_id in finding.job_ids:
                job = jobrows.get(conn, job_id)
                if job.state != JobState.RUNNING:
                    continue
                jobrows.add_event(conn, job_id, now, job.state, job.state, why, ACTOR)
                jobrows.update(conn, job_id, reason=why)

    # ------------------------------------------------------------------ act 2
    def _suspend(self, job: Job, partner: int, finding: Finding, now: float) -> None:
        why = (f"suspended: {finding.describe(now)}; it joined last, resumed when job "
               f"{partner} leaves {finding.gpu}")
        try:
            moved = self.loop._move(job, JobState.SUSPENDED, why, suspended_at=now,
                                    suspended_for=partner)
        except InvalidTransition:
            return
        self._send(moved, stop=True)

    def _send(self, job: Job, stop: bool) -> None:
        if job.node is None:
            return
        self.loop.actions.submit(job.node, ("suspend" if stop else "resume", job.id),
                                 partial(self._pause, job.node, job.id, job.owner, stop))

    def _pause(self, node: str, job_id: int, owner: str, stop: bool) -> None:
        """On the node's worker: the signal, then (resume) the commit."""
        from ..nodes import launcher

        try:
            launcher.pause(self.loop.pool, node, job_id, stop, owner=owner)
        except IadeepError as exc:
            log.warning("%s job %s on %s failed: %s (tried again next round)",
                        "suspending" if stop else "resuming", job_id, node, exc.message)
            return
        if stop:
            with self._lock:
                self._stop_sent.add(job_id)
            return
        with self.loop.store.tx() as conn:
            job = jobrows.get(conn, job_id)
        now = self.loop.clock()
        took = now - job.suspended_at if job.suspended_at is not None else 0.0
        fields = {"suspended_at": None, "suspended_for": None,
                  "suspended_s": job.suspended_s + took}
        try:
            if job.state == JobState.SUSPENDED:
                self.loop._move(job, JobState.RUNNING, f"resumed after {took:.0f} s suspended "
                                f"({job.suspended_s + took:.0f} s in all, not counted against "
                                "--time)", **fields)
            else:
                with self.loop.store.tx() as conn:
                    jobrows.update(conn, job_id, **fields)
        except InvalidTransition:
            pass
        with self._lock:
            self._stop_sent.discard(job_id)

    def _recover(self, jobs: list[Job], now: float) -> None:
        """Make every stopped-or-maybe-stopped job what it should be (see the module's
        docstring): resume those whose reason is gone, re-stop those whose reason holds."""
        policy = self.policy
        where = {j.id: (j.node, j.gpu_indices) for j in jobs
                 if j.state in (JobState.STARTING, JobState.RUNNING)}
        for job in jobs:
            if self.loop.actions.busy(job.id):
                continue
            if job.state == JobState.RUNNING and job.suspended_at is not None:
                self._send(job, stop=False)   # lost while suspended, seen running again
            elif job.state == JobState.SUSPENDED:
                gone = where.get(job.suspended_for or -1) != (job.node, job.gpu_indices)
                if gone or not (policy.enabled and policy.suspend) or job.spec.no_adapt:
                    self._send(job, stop=False)
                elif job.id not in self._stop_sent:
                    self._send(job, stop=True)   # e.g. a restart since the state was committed


def _shared(jobs: list[Job]) -> dict[str, list[Job]]:
    """GPU name -> its running single-GPU jobs, for GPUs with more than one such job and no
    suspended one (a GPU with a suspended job is already acted on)."""
    groups: dict[str, list[Job]] = {}
    busy: set[str] = set()
    for job in jobs:
        if job.node is None or len(job.gpu_indices) != 1:
            continue
        name = f"{job.node}:{job.gpu_indices[0]}"
        if job.state == JobState.RUNNING:
            groups.setdefault(name, []).append(job)
        else:
            busy.add(name)
    return {g: js for g, js in groups.items() if len(js) > 1 and g not in busy}


def _sharer(job: Job, speeds: dict[int, float]) -> Sharer:
    return Sharer(job.id, speeds.get(job.id), job.predicted_speed, job.spec.min_speed,
                  job.started_at or job.submitted_at, not job.spec.no_adapt)

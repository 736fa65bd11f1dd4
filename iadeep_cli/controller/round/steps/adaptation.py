"""Run-time adaptation, the acting half: what the controller does about a shared GPU gone wrong.

``scheduler/detectors.py`` decides (pure); this module feeds it each round's observed speeds and
acts, every action an event with the numbers that caused it (``queue show``, ``queue why``):

1. **No new partners**: a GPU with a finding goes to ``PlanInputs.closed``, so no job joins it;
   its jobs get an event (running -> running) and their ``queue why`` says so.
2. **Suspend and resume**: a GPU running worse than serial gets the job that joined last
   suspended (``suspended``, SIGSTOP to its process group; its GPU memory stays), and resumed
   (SIGCONT, ``running``) once the partner it was suspended for is no longer on that GPU.
   A job's speed is its owner's report, so it never acts on another's job alone
   (``to_suspend``): only a job whose own speed shows it slowed is suspended, not when the
   poll shows the GPU too idle for sharing to be the cause, and for at most
   ``max_suspend_s`` in all, after which it is resumed and left running.
3. **Refresh a profile on a phase change**: a job whose progress rate or GPU signature moved,
   for good, away from how it started and from its workload's profile
   (``scheduler/detectors.PhaseDetector``; alone on its GPU, the GPU's figures; sharing it,
   its utilisation alone estimated from its own SM share and speed, where the poll has
   per-process figures) gives that workload a *phase* sample, held as its
   owner's (their later jobs are judged by it) until a job of another user agrees, when it
   replaces the lab's profile (``store/profiles.refresh``) and the model is refitted; the job
   gets an event with the old and new numbers and what became of them.

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
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from ....errors import IadeepError, InvalidTransition
from ....jobs import ACTIVE, PENDING, Job, JobState, checkpoint_signal_of
from ....profiles import Profile
from ....scheduler.detectors import (
    MEM,
    RATE,
    UTIL,
    Detector,
    Finding,
    PhaseChange,
    PhaseDetector,
    Sharer,
    Solo,
    closed_gpus,
    solo_util,
)
from ....settings import AdaptPolicy
from ....store import jobrows, profiles as profrows
from ....text import gpus_at, hhmm
from ..context import Context, Round
from ..observer import SpeedObserver, job_sm

log = logging.getLogger("iadeep.controller")
ACTOR = "controller"


class Adapter:
    """Owned by the loop; ``run`` once a round after the speeds are observed (``step``, then
    ``phase_step``), ``closed`` for ``plan()``. Over the round's context (``loop``: the store,
    the lab, the pool, the node workers, the clock, job reads and moves), the observer's rates
    and the model's refit."""

    def __init__(self, loop: Context, observer: SpeedObserver, refit: Callable[[], None]):
        self.loop = loop
        self.observer = observer
        self._refit = refit
        self.detector = Detector()
        self.phases = PhaseDetector()
        self.findings: dict[str, Finding] = {}
        self._announced: set[tuple[Any, ...]] = set()   # (gpu, jobs, kinds) already given an event
        self._stop_sent: set[int] = set()     # SIGSTOP delivered by this controller process
        self._ck_stopping: set[int] = set()   # checkpointing jobs past their grace, stopped
        # GPU -> (the job still there, why): a pair undone by a checkpoint keeps its GPU closed
        # to partners while the job that stayed is there (else the requeued job would rejoin)
        self._held: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()

    @property
    def policy(self) -> AdaptPolicy:
        return self.loop.inventory.policy.adapt

    # ------------------------------------------------------------------ the round
    def run(self, r: Round) -> None:
        self.step(r.now, r.speeds, r.snapshot)
        self.phase_step(r.now, r.snapshot, r.profiles, r.lab)   # phase changes refresh profiles

    def step(self, now: float, speeds: dict[int, float], snapshot: Any = None) -> None:
        """Detect on this round's ``speeds`` (job id -> observed speed) and act; ``snapshot``:
        this round's poll (each GPU's own utilisation corroborates a suspension)."""
        jobs = self.loop.jobs(ACTIVE)
        self._recover(jobs, now)
        policy = self.policy
        if not policy.enabled:
            self.findings = {}
            return
        gpus = {name: [_sharer(j, speeds) for j in group]
                for name, group in _shared(jobs).items()}
        self.findings = self.detector.observe(now, gpus, policy)
        by_id = {j.id: j for j in jobs}
        self._held = {}
        for left in self.loop.jobs(PENDING | ACTIVE):
            if left.yielded is not None:
                gpu, stays = left.yielded
                if stays in by_id and _gpu_of(by_id[stays]) == gpu:
                    self._held[gpu] = (stays, f"job {left.id} was checkpointed off it: with "
                                              f"job {stays} it ran worse than serial")
        spent = {j.id for j in jobs if not j.spec.opportunistic
                 and j.suspended_s >= policy.max_suspend_s}
        for gpu, finding in self.findings.items():
            key = (gpu, finding.job_ids, finding.kinds)
            victim, why = None, ""
            if finding.worse_than_serial and policy.suspend:
                victim, why = to_suspend(gpus[gpu], policy, _busy(snapshot, gpu), spent)
            if key not in self._announced:
                self._announced.add(key)
                self._announce(finding, now, victim, why)
            job = by_id[victim.job_id] if victim is not None else None
            if job is not None and job.state == JobState.RUNNING:
                partner = next(s.job_id for s in gpus[gpu] if s.job_id != job.id)
                if checkpoint_signal_of(job.spec):
                    if job.checkpoint_at is None:
                        self._checkpoint(job, partner, f"{finding.describe(now)}; {why}", now)
                else:
                    self._suspend(job, partner, finding, why, now)
        live = {(g, f.job_ids, f.kinds) for g, f in self.findings.items()}
        self._announced &= live

    # ------------------------------------------------------------------ phase changes
    def phase_step(self, now: float, snapshot: Any, profiles: dict[str, Profile],
                   lab: dict[str, Profile]) -> list[PhaseChange]:
        """Feed the phase detector this round's one-GPU jobs' signatures alone against their
        workload's profile in effect, and refresh the profile of each phase change it reports.
        A job alone on its GPU: its progress rate (from the observer) and its GPU's
        utilisation (from the poll). A job sharing it: its utilisation alone estimated from
        its own SM share (where the poll has per-process figures: NVML, pmon) over its speed
        measured from progress (``solo_util``); no estimate, no signature this round."""
        jobs = self.loop.jobs(ACTIVE)
        per_gpu: dict[str, list[Job]] = {}
        for job in jobs:
            if (gpu := _gpu_of(job)) is not None:
                per_gpu.setdefault(gpu, []).append(job)
        rates = self.observer.alone_rates
        speeds = self.observer.progress_speeds
        solos: list[Solo] = []
        samples: dict[int, Any] = {}
        watched = [(job, len(group) > 1) for group in per_gpu.values() for job in group
                   if job.state == JobState.RUNNING and job.spec.workload
                   and (len(group) == 1 or job.id in speeds)]
        held: dict[tuple[str, str], Profile] = {}
        if watched:
            with self.loop.store.tx() as conn:
                held = profrows.held(conn)
        for job, sharing in watched:
            assert job.spec.workload is not None
            # a phase its owner's earlier job showed (held as theirs) is what it is judged by
            mine = held.get((job.owner, job.spec.workload))
            prof = mine or profiles.get(job.spec.workload)
            if prof is None:   # not profiled yet: nothing to refresh (profiling does it)
                continue
            gpu = snapshot.gpu(job.node, job.gpu_indices[0])
            learnt = mine or lab.get(job.spec.workload)
            if sharing:
                util = solo_util(job_sm(job, snapshot), speeds[job.id])
                if util is None:
                    continue
                samples[job.id] = (job, gpu, prof, learnt)
                # its speed against the lab's solo rate of the workload, not its own (never
                # measured alone): a start of its own (``Solo.provisional``)
                own = self.observer.solo_rate(job.id) is not None
                solos.append(Solo(job.id, job.spec.workload, util=util,
                                  profile_util=prof.gpu_util, adapt=not job.spec.no_adapt,
                                  sharing=True, provisional=not own))
                continue
            if gpu is not None and any(p.job_id not in (None, job.id) for p in gpu.processes):
                gpu = None     # another job's process there: its signature is not this job's
            samples[job.id] = (job, gpu, prof, learnt)
            solos.append(Solo(job.id, job.spec.workload, rates.get(job.id),
                              gpu.utilization_gpu if gpu is not None else None,
                              gpu.utilization_memory if gpu is not None else None,
                              learnt.solo_it_per_s if learnt is not None else None,
                              prof.gpu_util, prof.mem_util, not job.spec.no_adapt))
        changes = self.phases.observe(now, solos, self.policy, alive={j.id for j in jobs})
        for change in changes:
            job, gpu, prof, learnt = samples[change.job_id]
            self._refresh(change, job, gpu, prof, learnt, now)
        if changes:
            self._refit()
        return changes

    def _refresh(self, change: PhaseChange, job: Job, gpu: Any, prof: Profile,
                 learnt: Profile | None, now: float) -> None:
        """The phase sample: the profile in effect with what the job shows now (a shipped
        profile's solo rate is another program's, so it is dropped, as in ``learn``), written
        as the workload's profile; an event on the job with the numbers."""
        new = change.new
        sample = replace(
            prof, gpu_model=gpu.name if gpu is not None else prof.gpu_model,
            gpu_util=new.get(UTIL, prof.gpu_util), mem_util=new.get(MEM, prof.mem_util),
            solo_it_per_s=new.get(RATE, learnt.solo_it_per_s if learnt is not None else None))
        what = change.describe(now)
        with self.loop.store.tx() as conn:
            profile, verdict = profrows.refresh(conn, sample, job_id=job.id, owner=job.owner,
                                                now=now, note=what,
                                                rate_tolerance=self.policy.phase_threshold)
            why = (f"adapt: {what}; profile {job.spec.workload!r} on {sample.gpu_model} "
                   + (f"{verdict} (model refitting)" if profile is not None else verdict))
            current = jobrows.get(conn, job.id)
            jobrows.add_event(conn, job.id, now, current.state, current.state, why, ACTOR)
            jobrows.update(conn, job.id, reason=why)
        log.warning("%s", why)

    # ------------------------------------------------------------------ --opportunistic
    def make_room(self, queue: list[Job], active: list[Job], snapshot: Any,
                  profiles: dict[str, Profile],
                  decide: Callable[[list[Job], Any, list[Job]], Any]
                  ) -> bool:
        """Suspend (or checkpoint) the ``--opportunistic`` jobs on GPUs that a waiting regular
        job would get if they were not there: ``plan()`` is asked twice, pure both times,
        once as things are (who waits) and once without the opportunistic jobs (where those
        would go).  Each yields for the job that takes its GPU, and is resumed when it leaves.
        ``decide(queue, slots, active)``: plan() as the round asks it (the loop's, with its
        fair-share points and closed GPUs), so the trial ranks the waiting jobs as the round
        will. True if a job was told to yield (the active jobs changed)."""
        from ....scheduler.placement import slots_from_snapshot

        policy = self.policy
        if not (policy.enabled and policy.yield_opportunistic):
            return False
        opp = [j for j in active if j.spec.opportunistic and j.state == JobState.RUNNING
               and not j.spec.no_adapt and j.checkpoint_at is None and j.node is not None]
        regular = [j for j in queue if not j.spec.opportunistic]
        if not (opp and regular):
            return False
        inv, now = self.loop.inventory, self.loop.clock()
        slots = slots_from_snapshot(snapshot, active, inv, profiles)
        placed = {p.job_id for p in decide(regular, slots, self.residents(active)).placements}
        waiting = [j for j in regular if j.id not in placed]
        if not waiting:
            return False
        others = [j for j in active if not j.spec.opportunistic]
        trial = decide(waiting, slots_from_snapshot(snapshot, others, inv, profiles), others)
        yielded = False
        for p in trial.placements:
            for job in opp:
                if job.node == p.node and set(job.gpu_indices) & set(p.gpu_indices):
                    self._yield(job, p.job_id, gpus_at(p.node, p.gpu_indices), now)
                    yielded = True
        return yielded

    def _yield(self, job: Job, regular: int, where: str, now: float) -> None:
        why = (f"opportunistic: regular job {regular} waits for {where}; resumed when it "
               "leaves")
        if checkpoint_signal_of(job.spec):
            self._checkpoint(job, regular, f"opportunistic: regular job {regular} waits for "
                                           f"{where}", now)
            return
        try:
            moved = self.loop.move(job, JobState.SUSPENDED, f"suspended: {why}",
                                    suspended_at=now, suspended_for=regular)
        except InvalidTransition:
            return
        self._send(moved, stop=True)

    def residents(self, active: list[Job]) -> list[Job]:
        """The active jobs ``plan()`` sees on GPUs: a suspended ``--opportunistic`` job holds
        its memory (counted in the slots) but neither computes nor takes a place."""
        return [j for j in active if not (j.spec.opportunistic
                                          and j.state == JobState.SUSPENDED)]

    def closed(self, now: float) -> dict[str, str]:
        out = {g: why for g, (_, why) in self._held.items()} if self.policy.enabled else {}
        out.update(closed_gpus(self.findings, now, self.policy))
        return out

    # ------------------------------------------------------------------ act 1
    def _announce(self, finding: Finding, now: float, victim: Sharer | None, why: str) -> None:
        """One event per job of the GPU, with the numbers (``queue show``), and the reason
        ``queue why`` prints."""
        what = finding.describe(now)
        acts = []
        if self.policy.stop_partners:
            acts.append("no new partners join it")
        if finding.worse_than_serial and self.policy.suspend:
            acts.append(f"job {victim.job_id} is suspended ({why})" if victim is not None
                        else f"nobody is suspended: {why}")
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
    def _suspend(self, job: Job, partner: int, finding: Finding, chosen: str, now: float
                 ) -> None:
        why = (f"suspended: {finding.describe(now)}; {chosen}, resumed when job "
               f"{partner} leaves {finding.gpu} (at most "
               f"{self.policy.max_suspend_s:g} s suspended in all)")
        try:
            moved = self.loop.move(job, JobState.SUSPENDED, why, suspended_at=now,
                                    suspended_for=partner)
        except InvalidTransition:
            return
        self._send(moved, stop=True)

    def grace_s(self, job: Job) -> float:
        """How long a checkpointing job may take to save and exit before it is stopped (and
        requeued all the same): the lab's ``preempt_grace`` for a --requeue job, else
        ``kill_grace``."""
        inv = self.loop.inventory
        return inv.policy.preempt_grace_s if job.spec.requeue else inv.kill_grace_s

    def preempt(self, job: Job, for_what: str, now: float) -> bool:
        """Checkpoint and requeue a running --requeue job for ``for_what`` ("job 7": plan()'s
        preemption; "alice": ``queue requeue``): the intent and the mark committed first, then
        its checkpoint signal, at most once an attempt (across rounds and controller
        restarts); ``checkpointed`` requeues it when it exits, or the grace ends. False if it
        is not (or no longer) a running --requeue job, or already checkpointing."""
        if not job.spec.requeue or job.state != JobState.RUNNING:
            return False
        by = f"preempted for {for_what}" if for_what.startswith("job ") else \
            f"requeued by {for_what}"
        return self._checkpoint(job, None, f"{by} at {hhmm(now)}", now, preempt_for=for_what)

    def _checkpoint(self, job: Job, partner: int | None, what: str, now: float,
                    preempt_for: str | None = None) -> bool:
        """Instead of suspending a ``--checkpoint-signal`` job: mark it (committed first, so
        the signal goes at most once an attempt, as --signal's), then send its signal; it saves
        and exits, and ``checkpointed`` queues it again.  Past its grace (``grace_s``) it is
        stopped as a cancel would (``_recover``), and requeued all the same."""
        name = checkpoint_signal_of(job.spec) or "USR1"
        why = (f"checkpoint: {what}: SIG{name} sent, requeued when it exits (stopped after "
               f"{self.grace_s(job):g} s)")
        with self.loop.store.tx() as conn:
            current = jobrows.get(conn, job.id)
            if current.checkpoint_at is not None or current.state != JobState.RUNNING:
                return False
            marks: dict[str, Any] = {"suspended_for": partner}
            if preempt_for is not None or current.preempt_for is not None:
                marks.update(preempt_for=preempt_for or current.preempt_for,
                             preempt_at=current.preempt_at or now)
            jobrows.update(conn, job.id, checkpoint_at=now, reason=why, **marks)
            jobrows.add_event(conn, job.id, now, job.state, job.state, why, ACTOR)
        if job.node is not None:
            self.loop.actions.submit(job.node, ("checkpoint", job.id),
                                     partial(self._signal, job.node, job.id, name, job.owner))
        return True

    def _signal(self, node: str, job_id: int, name: str, owner: str) -> None:
        try:
            self.loop.pool.backend(node).signal(job_id, name, owner=owner)
        except IadeepError as exc:   # not repeated: past the grace it is stopped anyway
            log.warning("checkpoint signal to job %s on %s failed: %s", job_id, node,
                        exc.message)

    def _stop_checkpointing(self, node: str, job_id: int, owner: str) -> None:
        try:
            self.loop.pool.backend(node).cancel(job_id,
                                                grace_s=self.loop.inventory.kill_grace_s,
                                                owner=owner)
        except IadeepError as exc:
            log.warning("stopping checkpointing job %s on %s failed: %s", job_id, node,
                        exc.message)
            with self._lock:
                self._ck_stopping.discard(job_id)

    def checkpointed(self, job: Job, code: int | None) -> bool:
        """The loop saw a job end after its --checkpoint-signal was sent: queue it again (no
        retry spent; the attempt's directory is set aside like a requeued one's, so the
        checkpoint must be in its working directory: --chdir, or a shared submission
        directory). False if it cannot move (it was not running): the loop ends it as usual."""
        if job.state != JobState.RUNNING or job.stop_reason:
            return False
        where = job.spec.workdir or job.spec.submit_dir or "its job directory"
        note: dict[str, Any] = {}
        if job.preempt_for is not None:   # preempted, or `queue requeue`: what queue why says
            by = "preempted for" if job.preempt_for.startswith("job ") else "requeued by"
            note["preempted"] = (f"{by} {job.preempt_for} at "
                                 f"{hhmm(job.preempt_at or job.checkpoint_at or 0)}; requeued")
        try:
            self.loop.requeue(
                job, f"checkpointed on SIG{checkpoint_signal_of(job.spec)} (exit "
                f"code {code}); {note.get('preempted', 'requeued')}, to resume in {where} "
                f"where it fits (attempt {job.attempts + 1}, checkpoint "
                f"{job.checkpoints + 1}; no retry spent)",
                started=True, checkpoints=job.checkpoints + 1,
                yielded=(_gpu_of(job), job.suspended_for)
                if _gpu_of(job) and job.suspended_for else None, **note)
        except InvalidTransition:
            return False
        with self._lock:
            self._ck_stopping.discard(job.id)
        return True

    def _send(self, job: Job, stop: bool, why: str = "") -> None:
        if job.node is None:
            return
        self.loop.actions.submit(job.node, ("suspend" if stop else "resume", job.id),
                                 partial(self._pause, job.node, job.id, job.owner, stop, why))

    def _pause(self, node: str, job_id: int, owner: str, stop: bool, why: str = "") -> None:
        """On the node's worker: the signal, then (resume) the commit."""
        try:
            backend = self.loop.pool.backend(node)
            (backend.suspend if stop else backend.resume)(job_id, owner=owner)
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
                self.loop.move(job, JobState.RUNNING, f"resumed after {took:.0f} s suspended "
                                f"({job.suspended_s + took:.0f} s in all, not counted against "
                                f"--time){why}", **fields)
            else:
                with self.loop.store.tx() as conn:
                    jobrows.update(conn, job_id, **fields)
        except InvalidTransition:
            pass
        with self._lock:
            self._stop_sent.discard(job_id)

    def _may_stay_suspended(self, job: Job) -> bool:
        """Whether the lab's settings still allow ``job`` to be stopped for another: by
        ``suspend`` (a pair worse than serial), or, for an ``--opportunistic`` job, also by
        ``yield_opportunistic`` (it gave its GPU to a waiting regular job)."""
        policy = self.policy
        return policy.enabled and (policy.suspend or (job.spec.opportunistic
                                                      and policy.yield_opportunistic))

    def _recover(self, jobs: list[Job], now: float) -> None:
        """Make every stopped-or-maybe-stopped job what it should be (see the module's
        docstring): resume those whose reason is gone, re-stop those whose reason holds."""
        policy = self.policy
        where = {j.id: (j.node, j.gpu_indices) for j in jobs
                 if j.state in (JobState.STARTING, JobState.RUNNING)}
        for job in jobs:
            if self.loop.actions.busy(job.id):
                continue
            if (job.state == JobState.RUNNING and job.preempt_at is not None
                    and job.checkpoint_at is None and job.preempt_for is not None):
                self.preempt(job, job.preempt_for, now)   # `queue requeue` asked it
                continue
            if (job.state == JobState.RUNNING and job.checkpoint_at is not None
                    and now - job.checkpoint_at > self.grace_s(job)
                    and job.node is not None and job.id not in self._ck_stopping):
                with self._lock:
                    self._ck_stopping.add(job.id)
                self.loop.actions.submit(job.node, ("ckstop", job.id), partial(
                    self._stop_checkpointing, job.node, job.id, job.owner))
            if job.state == JobState.RUNNING and job.suspended_at is not None:
                self._send(job, stop=False)   # lost while suspended, seen running again
            elif job.state == JobState.SUSPENDED:
                other = where.get(job.suspended_for or -1)
                gone = other is None or other[0] != job.node or not (
                    set(other[1]) & set(job.gpu_indices))
                if (not job.spec.opportunistic and job.suspended_at is not None
                        and job.suspended_s + now - job.suspended_at >= policy.max_suspend_s):
                    self._send(job, stop=False, why=f": the lab's limit (max_suspend_s "
                               f"{policy.max_suspend_s:g}); not suspended for others again")
                elif gone or not self._may_stay_suspended(job) or job.spec.no_adapt:
                    self._send(job, stop=False)
                elif job.id not in self._stop_sent:
                    self._send(job, stop=True)   # e.g. a restart since the state was committed


def _shared(jobs: list[Job]) -> dict[str, list[Job]]:
    """GPU name -> its running single-GPU jobs, for GPUs with more than one such job and no
    suspended one (a GPU with a suspended job is already acted on)."""
    groups: dict[str, list[Job]] = {}
    busy: set[str] = set()
    for job in jobs:
        if (name := _gpu_of(job)) is None:
            continue
        if job.state == JobState.RUNNING:
            groups.setdefault(name, []).append(job)
        else:
            busy.add(name)
    return {g: js for g, js in groups.items() if len(js) > 1 and g not in busy}


def to_suspend(sharers: list[Sharer], policy: AdaptPolicy, busy: float | None, spent: set[int]
               ) -> tuple[Sharer | None, str]:
    """Which job a GPU that runs worse than serial gets suspended, and why (or None, and why
    nobody). A job's speed is its owner's own report, so it acts on that job alone: only a
    job whose *own* speed shows it slowed (``_slowed``) is suspended, never a partner whose
    speed is as predicted (the one whose numbers changed is the one acted on); among those, an
    ``--opportunistic`` one first, else the one that joined last, and if that one opted out
    (``--no-adapt``) nobody (its partner was there first: it does not pay for the opt-out).
    The node must agree: a GPU busy (``busy``: its utilisation, from the poll) less than
    ``policy.busy_util`` is not what slows its jobs, so suspending one would help nobody.
    Jobs in ``spent`` were suspended ``max_suspend_s`` in all already."""
    if busy is not None and busy < policy.busy_util:
        return None, (f"the GPU was busy {busy:.0f}% (< busy_util {policy.busy_util:g}%): "
                      "the GPU is not what slows them")
    slowed = [s for s in sharers if _slowed(s, policy, len(sharers))]
    if not slowed:
        return None, "no job's own speed shows it slowed"
    opportunists = [s for s in slowed if s.opportunistic and s.adapt and s.job_id not in spent]
    if opportunists:
        return max(opportunists, key=lambda s: (s.joined_at, s.job_id)), "it is --opportunistic"
    last = max(slowed, key=lambda s: (s.joined_at, s.job_id))
    if not last.adapt:
        return None, f"job {last.job_id}, the last to join of those slowed, is --no-adapt"
    if last.job_id in spent:
        return None, (f"job {last.job_id} was suspended for {policy.max_suspend_s:g} s "
                      "(max_suspend_s) already")
    if last.joined_at >= max(s.joined_at for s in sharers):
        return last, "it joined last"
    return last, "its own speed shows it slowed, its later partner's does not"


def _slowed(s: Sharer, policy: AdaptPolicy, n: int) -> bool:
    """Whether a job's own observed speed shows it slowed: below its predicted speed by more
    than the margin, or below its own ``--min-speed``; with neither to compare, below its even
    share of running serially."""
    if s.observed is None:
        return False
    if s.predicted is None and s.floor is None:
        return s.observed < (1.0 - policy.serial_margin) / n
    return ((s.predicted is not None and s.observed < s.predicted - policy.margin)
            or (s.floor is not None and s.observed < s.floor))


def _busy(snapshot: Any, gpu: str) -> float | None:
    """A GPU's utilisation (%) in this round's poll, None where it is not reported."""
    if snapshot is None:
        return None
    node, _, index = gpu.rpartition(":")
    sample = snapshot.gpu(node, int(index))
    return sample.utilization_gpu if sample is not None else None


def _gpu_of(job: Job) -> str | None:
    """The name ("node:index") of the one GPU a job holds; None for none or several."""
    if job.node is None or len(job.gpu_indices) != 1:
        return None
    return f"{job.node}:{job.gpu_indices[0]}"


def _sharer(job: Job, speeds: dict[int, float]) -> Sharer:
    return Sharer(job.id, speeds.get(job.id), job.predicted_speed, job.spec.min_speed,
                  job.started_at or job.submitted_at, not job.spec.no_adapt,
                  job.spec.opportunistic)

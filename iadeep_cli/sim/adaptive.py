"""The simulator's run-time adaptation: what ``iadeep`` does to running jobs, as the controller.

``iadeep-static`` is ``plan()`` alone: a placement is final. ``iadeep`` adds what
``controller/round/steps/adaptation.py`` does, decided by the same pure detectors
(``scheduler/detectors.py``), fed every ``POLL_S`` of virtual time with what a poll would show:

- each running job's speed (the truth for the workload it *is* now, see ``--phase-shift``),
  with the shipped measurements' +-2% spread (``JITTER``), against the speed ``plan()``
  predicted for it when it or its partner was placed;
- for a job alone on its GPU, its GPU and memory utilisation (the profile of the workload it
  is now, with the same spread) against its profile: the simulator has no iterations/s (work
  is in solo seconds), so only the signature can show a phase change here;
- for a job sharing its GPU, its own SM share, as NVML's per-process utilisation would show it:
  its workload's utilisation alone times its speed (time-sliced, a job doing ``speed`` of its
  solo work holds the SMs about that much of the time), with the same spread; over its
  observed speed that estimates its utilisation alone (``detectors.solo_util``), as the
  controller does on a node whose poll has per-process figures.

and it acts as the controller does, as ``lab.policy.adapt`` says (by default only the
refresh): a phase change refreshes the job's profile; with ``stop_partners`` a GPU with a
finding takes no new partners (``PlanInputs.closed``); with ``suspend`` a GPU worse than serial
gets the job that joined last suspended (it keeps its place and memory, does no work, and is
no partner) and resumed as soon as its partner leaves that GPU. One difference, on
purpose: the controller refreshes the *label's* profile (a lab whose jobs of one label change
phase alike wants the next job placed by the new phase), while here the refreshed profile is
the job's own, namely the profile of the workload it switched to (what its signature shows):
the generated jobs switch to random workloads, so a label-wide refresh would misplace the next
job of that label, which starts in its first phase.
A second simplification: a job found sharing gets that whole profile too, though only its
utilisation was seen (the controller's sample keeps the profile's memory figures).
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..jobs import Job
from ..profiles import Profile
from ..scheduler.detectors import (
    MEM,
    MIN_SHARED_SPEED,
    SPEED_CAP,
    UTIL,
    Detector,
    PhaseDetector,
    Sharer,
    Solo,
    closed_gpus,
    last_joined,
    solo_util,
)
from ..settings import AdaptPolicy

# a job fed to the phase detector: its id, the lowest and highest value of each metric a
# poll's jitter can show (None: whether it shows any depends on the jitter), its profile's
_Reach = tuple[int, "dict[str, tuple[float, float]] | None", "dict[str, float | None]"]
POLL_S = 60.0      # virtual seconds between polls (a lab's poll_interval is seconds; the
#                    defaults' observe_s 300 s and phase_persist_s 600 s make it immaterial)
JITTER = 0.02      # the +-2% spread of the shipped measurements


class AdaptHooks:
    """Owned by one ``iadeep`` planner: the engine calls ``next_poll`` for its event queue and
    ``step`` after every event; ``closed`` goes to ``plan()``; ``placed`` records predictions."""

    def __init__(self, profiles: Mapping[str, Profile], policy: AdaptPolicy, seed: int,
                 poll_s: float = POLL_S, skip_quiet: bool = True):
        self.profiles = profiles
        self.policy = policy
        self.poll_s = poll_s
        self.rng = random.Random(f"adapt-observe:{seed}")
        self.detector = Detector()
        self.phases = PhaseDetector()
        self.predicted: dict[int, float] = {}
        self.suspended_for: dict[int, int] = {}     # suspended job -> the partner it waits on
        self.closed: dict[str, str] = {}
        self.findings: dict[str, Any] = {}
        self._next = 0.0
        self.suspensions = 0
        self.refreshes = 0
        # quiet polls: after a poll whose outcome no jitter could change (no finding, no
        # symptom within reach, no phase shift within reach), the next polls in the same
        # state (until the engine says it changed: ``changed``) only draw the random numbers
        # that poll drew, so the stream, and every later decision, stays what it was
        self.skip_quiet = skip_quiet
        self._quiet_draws: int | None = None
        self._draws = 0
        self.skipped = 0

    def next_poll(self, t: float) -> float:
        if self._next <= t:
            self._next = (math.floor(t / self.poll_s) + 1) * self.poll_s
        return self._next

    def placed(self, predicted_speeds: Mapping[int, float]) -> None:
        self.predicted.update(predicted_speeds)
        self._quiet_draws = None

    def changed(self) -> None:
        """The engine changed what a poll sees (jobs, GPUs, speeds, phases): the next poll
        looks again."""
        self._quiet_draws = None

    def step(self, t: float, running: dict[int, Job], on_gpu: Mapping[tuple, list[int]],
             phases: Any, speed: Mapping[int, float],
             solo: Callable[[tuple, str], float] | None = None) -> bool:
        """After an event at ``t``: resume whoever's partner left (always), and at a poll
        detect and act. Returns whether anything changed (the engine then re-plans).
        ``solo(gpu key, workload)``: on a mixed cluster, the job's speed alone on that GPU's
        model, so an observed speed is relative to running alone there, as the controller's
        (and as ``plan()``'s predictions) are."""
        acted = self._resume(running, on_gpu, phases)
        if t + 1e-6 < self._next:
            return self._reopen(t, on_gpu, phases) or acted
        self._next = (math.floor(t / self.poll_s + 1e-9) + 1) * self.poll_s
        if not self.policy.enabled:
            return acted
        if self._quiet_draws is not None and not acted:
            draw = self.rng.random   # what _jitter draws (uniform: one random() each)
            for _ in range(self._quiet_draws):
                draw()
            self.skipped += 1
            return False
        self._quiet_draws = None
        draws = self._draws
        groups = {f"{node}:{i}": [j for j in ids if j not in phases.paused]
                  for (node, i), ids in on_gpu.items() if ids}
        shared = {g: ids for g, ids in groups.items()
                  if len(ids) > 1 and len(ids) == len(on_gpu[_key(g)])
                  and all(len(running[j].gpu_indices) == 1 for j in ids)}
        def observed(g: str, j: int) -> float | None:
            v = speed.get(j)
            return None if v is None else v / (solo(_key(g), phases.now[j]) if solo else 1.0)

        raw = {g: [(j, observed(g, j)) for j in ids] for g, ids in shared.items()}
        sharers = {g: [Sharer(j, self._jitter(v), self.predicted.get(j),
                              None, running[j].started_at or 0.0) for j, v in pairs]
                   for g, pairs in raw.items()}
        findings = self.findings = self.detector.observe(t, sharers, self.policy)
        closed = closed_gpus(findings, t, self.policy)
        # which GPUs are closed is news; their reasons are not (they say for how long, so they
        # change at every poll and would re-plan each one while a finding lasts)
        acted = acted or closed.keys() != self.closed.keys()
        self.closed = closed
        if self.policy.suspend:
            for g, f in findings.items():
                victim = last_joined(sharers[g]) if f.worse_than_serial else None
                if victim is not None and victim.job_id not in phases.paused:
                    partner = next(s.job_id for s in sharers[g] if s.job_id != victim.job_id)
                    phases.paused.add(victim.job_id)
                    self.suspended_for[victim.job_id] = partner
                    self.suspensions += 1
                    acted = True
        reach: list[_Reach] = []
        changed = self._phase(t, running, groups, phases, observed, reach)
        acted = changed or acted
        # the sharing detector's findings act only through closed GPUs and suspensions: with
        # both off (the default) what it finds changes nothing, whatever the jitter
        findings_act = self.policy.stop_partners or self.policy.suspend
        if (self.skip_quiet and not acted
                and (not findings_act or (not findings and all(
                    self._no_symptom(pairs) for pairs in raw.values())))
                and (not self.policy.phase or all(self._no_shift(*r) for r in reach))):
            self._quiet_draws = self._draws - draws
        return acted

    def _no_symptom(self, pairs: list[tuple[int, float | None]]) -> bool:
        """Whether no jitter of these observed speeds could show a symptom on their GPU."""
        low = []
        for j, v in pairs:
            if v is None:
                return False
            lo = v * (1.0 - _REACH)
            p = self.predicted.get(j)
            if p is not None and lo <= p - self.policy.margin + _EPS:
                return False
            low.append(lo)
        return sum(low) > 1.0 - self.policy.serial_margin + _EPS

    def _no_shift(self, job_id: int, ranges: Mapping[str, tuple[float, float]] | None,
                  profile: Mapping[str, float | None]) -> bool:
        """Whether no jitter within ``ranges`` (metric -> lowest, highest value a poll can
        show) could move job ``job_id`` away from its start and its profile (a phase shift)."""
        if ranges is None:
            return False
        start = self.phases.start_of(job_id)
        limit = self.policy.phase_util - _EPS

        def far(ref: float | None, lo: float, hi: float) -> bool:
            return ref is None or hi - ref >= limit or ref - lo >= limit
        for k, (lo, hi) in ranges.items():
            s = start.get(k)
            if s is not None and far(s, lo, hi) and far(profile.get(k), lo, hi):
                return False
        return True

    def _reopen(self, t: float, on_gpu, phases) -> bool:
        """Between polls: a GPU whose jobs changed (a partner ended) is no longer the GPU the
        finding was about, so it takes partners again at once, as in the controller's next
        round (which re-plans right after it re-detects); without this a GPU would stay closed
        until the next virtual poll."""
        if not self.closed:
            return False
        keep = {g: f for g, f in self.findings.items()
                if sorted(j for j in on_gpu.get(_key(g), ()) if j not in phases.paused)
                == sorted(f.job_ids)}
        if len(keep) == len(self.findings):
            return False
        self.findings = keep
        self.closed = closed_gpus(keep, t, self.policy)
        return True

    def _resume(self, running: dict[int, Job], on_gpu, phases) -> bool:
        """Resume every suspended job whose partner is no longer on its GPU."""
        acted = False
        for job_id, partner in list(self.suspended_for.items()):
            job = running.get(job_id)
            other = running.get(partner)
            if job is None or other is None or other.node != job.node or not (
                    set(other.gpu_indices) & set(job.gpu_indices)):
                phases.paused.discard(job_id)
                del self.suspended_for[job_id]
                acted = True
        return acted

    def _phase(self, t: float, running: dict[int, Job], groups: Mapping[str, list[int]],
               phases, observed: Callable[[str, int], float | None],
               reach: list[_Reach]) -> bool:
        """Feed the phase detector each one-GPU job's signature alone (measured alone,
        estimated while sharing) and relabel the jobs it reports. ``reach`` gets, per job
        fed, the range of values any jitter could have shown and its profile's (quiet polls,
        ``_no_shift``); a job whose figures could be missing or not gets None: the poll is
        not quiet."""
        if not self.policy.phase:
            return False
        solos = []
        for g, ids in groups.items():
            for job_id in ids:
                job = running[job_id]
                label = job.spec.workload or ""
                mine, believed = self.profiles.get(phases.now[job_id]), self.profiles.get(label)
                if len(job.gpu_indices) != 1 or mine is None or believed is None:
                    continue
                if len(ids) == 1:
                    solos.append(Solo(job_id, label, None, self._jitter(mine.gpu_util),
                                      self._jitter(mine.mem_util), None, believed.gpu_util,
                                      believed.mem_util))
                    reach.append((job_id, {k: _spread(v) for k, v in
                                           ((UTIL, mine.gpu_util), (MEM, mine.mem_util))
                                           if v is not None},
                                  {UTIL: believed.gpu_util, MEM: believed.mem_util}))
                    continue
                speed = observed(g, job_id)
                sm_share = None if speed is None or mine.gpu_util is None \
                    else self._jitter(mine.gpu_util * speed)
                util = solo_util(sm_share, self._jitter(speed))
                if util is not None:
                    solos.append(Solo(job_id, label, util=util, profile_util=believed.gpu_util,
                                      sharing=True))
                if sm_share is not None and speed is not None and mine.gpu_util is not None:
                    reach.append(_shared_reach(job_id, mine.gpu_util, speed,
                                               believed.gpu_util))
        changes = self.phases.observe(t, solos, self.policy, alive=set(running))
        for change in changes:
            running[change.job_id] = relabelled(running[change.job_id],
                                                phases.now[change.job_id])
            self.refreshes += 1
        return bool(changes)

    def start(self, job_id: int, label: str) -> None:
        """A job placed: it starts in the phase its label's profile describes (a switch comes
        after 20% of its work), so that is its phase detector's starting point."""
        p = self.profiles.get(label)
        if p is not None:
            self.phases.begin(job_id, {k: v for k, v in ((UTIL, p.gpu_util), (MEM, p.mem_util))
                                       if v is not None})

    def _jitter(self, value: float | None) -> float | None:
        if value is None:
            return None
        self._draws += 1
        return value * self.rng.uniform(1 - JITTER, 1 + JITTER)


# what a quiet poll's checks allow for: the jitter's spread, a little wider (rounding), and
# a margin on every comparison, so a poll called quiet certainly is
_REACH = JITTER * 1.001 + 1e-9
_EPS = 1e-9


def _spread(value: float) -> tuple[float, float]:
    return value * (1.0 - _REACH), value * (1.0 + _REACH)


def _shared_reach(job_id: int, util: float, speed: float, believed: float | None
                  ) -> tuple[int, dict[str, tuple[float, float]] | None,
                             dict[str, float | None]]:
    """The utilisation alone a sharing job's poll can estimate (``solo_util`` of its jittered
    SM share over its jittered speed); None when whether it estimates one at all depends on
    the jitter (its speed near ``solo_util``'s limits)."""
    lo_s, hi_s = _spread(speed)
    if hi_s < MIN_SHARED_SPEED or lo_s >= SPEED_CAP:
        return job_id, {}, {}                 # never an estimate: nothing fed
    if lo_s < MIN_SHARED_SPEED or hi_s >= SPEED_CAP:
        return job_id, None, {}               # maybe: not a quiet poll
    lo = min(100.0, util * (1.0 - _REACH) / (1.0 + _REACH))
    hi = min(100.0, util * (1.0 + _REACH) / (1.0 - _REACH))
    return job_id, {UTIL: (lo, hi)}, {UTIL: believed}


def _key(gpu: str) -> tuple[str, int]:
    node, _, index = gpu.rpartition(":")
    return node, int(index)


def relabelled(job: Job, workload: str) -> Job:
    return replace(job, spec=replace(job.spec, workload=workload))


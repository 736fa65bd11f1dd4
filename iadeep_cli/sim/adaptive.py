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

POLL_S = 60.0      # virtual seconds between polls (a lab's poll_interval is seconds; the
#                    defaults' observe_s 300 s and phase_persist_s 600 s make it immaterial)
JITTER = 0.02      # the +-2% spread of the shipped measurements


class AdaptHooks:
    """Owned by one ``iadeep`` planner: the engine calls ``next_poll`` for its event queue and
    ``step`` after every event; ``closed`` goes to ``plan()``; ``placed`` records predictions."""

    def __init__(self, profiles: Mapping[str, Profile], policy: AdaptPolicy, seed: int,
                 poll_s: float = POLL_S):
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

    def next_poll(self, t: float) -> float:
        if self._next <= t:
            self._next = (math.floor(t / self.poll_s) + 1) * self.poll_s
        return self._next

    def placed(self, predicted_speeds: Mapping[int, float]) -> None:
        self.predicted.update(predicted_speeds)

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
        groups = {f"{node}:{i}": [j for j in ids if j not in phases.paused]
                  for (node, i), ids in on_gpu.items() if ids}
        shared = {g: ids for g, ids in groups.items()
                  if len(ids) > 1 and len(ids) == len(on_gpu[_key(g)])
                  and all(len(running[j].gpu_indices) == 1 for j in ids)}
        def observed(g: str, j: int) -> float | None:
            v = speed.get(j)
            return None if v is None else v / (solo(_key(g), phases.now[j]) if solo else 1.0)

        sharers = {g: [Sharer(j, self._jitter(observed(g, j)), self.predicted.get(j),
                              None, running[j].started_at or 0.0) for j in ids]
                   for g, ids in shared.items()}
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
        acted = self._phase(t, running, groups, phases, observed) or acted
        return acted

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
               phases, observed: Callable[[str, int], float | None]) -> bool:
        """Feed the phase detector each one-GPU job's signature alone (measured alone,
        estimated while sharing) and relabel the jobs it reports."""
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
                    continue
                speed = observed(g, job_id)
                sm_share = None if speed is None or mine.gpu_util is None \
                    else self._jitter(mine.gpu_util * speed)
                util = solo_util(sm_share, self._jitter(speed))
                if util is not None:
                    solos.append(Solo(job_id, label, util=util, profile_util=believed.gpu_util,
                                      sharing=True))
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
        return None if value is None else value * self.rng.uniform(1 - JITTER, 1 + JITTER)


def _key(gpu: str) -> tuple[str, int]:
    node, _, index = gpu.rpartition(":")
    return node, int(index)


def relabelled(job: Job, workload: str) -> Job:
    return replace(job, spec=replace(job.spec, workload=workload))


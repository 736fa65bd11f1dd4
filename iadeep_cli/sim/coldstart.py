"""Cold start and labels in the simulator: what the scheduler believes a job is, apart from
what it is.

A ``SimJob``'s ``workload`` is what it *is* (the truth's speeds, its memory); its ``label`` is
what the scheduler is told (the controller's ``--workload``, or the program label a job
without one gets). Three scenarios set labels apart from workloads:

- ``--new-workloads F``: a fraction F of the jobs are programs the lab has never run: each
  gets a label of its own (``resnet18-new17``: the part before '-' is still its family, so
  ``--lowo`` holds out the right model) that has no profile when it is submitted. ``plan()``
  then does what it does in the controller for "no profile yet": the job waits for an empty
  GPU, nothing joins it, and a job of it blocked past ``reserve_after_s`` reserves GPUs.
  ``Profiler`` mirrors ``controller/round/steps/profile.py``: every ``POLL_S`` a running
  one-GPU job without a profile that is alone on its GPU is sampled, and after
  ``PROFILE_SAMPLES`` such polls (a minute) its label gets a profile (the workload's own, each
  figure with the +-2% spread of the measurements), which every policy sees from then on.
- ``--cold-start share``: the shortened path. Where the poll carries per-process figures
  (NVML, or ``nvidia-smi pmon`` over SSH), a new job need not be alone to be profiled, so it
  starts under a *provisional* profile (``prior_profile``: the lab's heaviest figures, so
  ``plan()`` shares it only where even a heavy job pays, and its memory counted as the largest
  known) and is profiled while it shares; ``--cold-start alone`` (the default) is the
  controller today.
- ``--coarse-labels``: two programs under one label (every member's ``train.py``): the
  workloads are paired (in name order) and both of a pair carry the first one's name, whose
  profile the label has (the second program's samples are rejected as outliers, as the
  controller's ``learn`` does). ``--wrong-labels F``: a fraction F of the jobs carry another
  workload's label, drawn at random.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from ..errors import InputError
from ..jobs import Job
from ..profiles import Profile
from ..settings import Inventory
from .engine import SimJob

# virtual seconds between the profiler's polls: a lab's default poll interval
# (Inventory.poll_interval_s), so a new job is profiled in its first minute, as in the
# controller (sim/adaptive.py polls every 60 s: its detectors wait minutes anyway)
POLL_S = Inventory.poll_interval_s
PROFILE_SAMPLES = 6    # polls before a label is profiled: the controller's (steps/profile.py)
JITTER = 0.02          # the +-2% spread of the shipped measurements
COLD_START_MODES = ("alone", "share")
PRIOR = "#prior"       # suffix of a provisional profile's name (its predictions cached apart)


def _fraction(flag: str, frac: float, example: str) -> None:
    if not (math.isfinite(frac) and 0.0 <= frac <= 1.0):
        raise InputError(f"{flag} must be a fraction between 0 and 1, got {frac:g}",
                         hint=f"e.g. {flag} {example}")


def new_label(workload: str, job_id: int) -> str:
    """The label of a program the lab has never run: ``resnet18-new17``."""
    return f"{workload}-new{job_id}"


def mark_new_workloads(jobs: Sequence[SimJob], frac: float, seed: int) -> list[SimJob]:
    """``--new-workloads F``: that fraction of the jobs (drawn with a random of its own, so the
    trace is the same as without) each a program never run before, with a label of its own."""
    _fraction("--new-workloads", frac, "0.3")
    if frac == 0.0:
        return list(jobs)
    rng = random.Random(f"new-workloads:{seed}")
    chosen = set(rng.sample([j.id for j in jobs], round(frac * len(jobs))))
    return [replace(j, label=new_label(j.workload, j.id)) if j.id in chosen else j
            for j in jobs]


def coarse_pairs(workloads: Iterable[str]) -> dict[str, str]:
    """Workload -> the label it shares with another: in name order, the second of each pair
    takes the first one's name (an odd one out keeps its own)."""
    names = sorted(set(workloads))
    return {b: a for a, b in zip(names[0::2], names[1::2])}


def mark_labels(jobs: Sequence[SimJob], workloads: Sequence[str], *, coarse: bool = False,
                wrong: float = 0.0, seed: int = 0) -> list[SimJob]:
    """``--coarse-labels`` and ``--wrong-labels F`` (see the module's text); a job already
    given a label (a new workload) keeps it."""
    _fraction("--wrong-labels", wrong, "0.1")
    names = sorted(set(workloads))
    out = list(jobs)
    if coarse:
        under = coarse_pairs(names)
        out = [replace(j, label=under[j.workload]) if not j.label and j.workload in under
               else j for j in out]
    if wrong > 0.0 and len(names) > 1:
        rng = random.Random(f"wrong-labels:{seed}")
        chosen = set(rng.sample([j.id for j in out], round(wrong * len(out))))
        out = [replace(j, label=rng.choice([w for w in names if w != j.workload]))
               if j.id in chosen and not j.label else j for j in out]
    return out


def prior_profile(known: Mapping[str, Profile], label: str) -> Profile:
    """A provisional profile for a program never profiled: each figure the largest among the
    lab's profiles (as heavy as the heaviest job the lab knows, its memory the largest), named
    ``label#prior`` so its predictions are cached apart from the measured profile's."""
    ps = list(known.values())
    if not ps:
        raise InputError("no profile to take a provisional one from",
                         hint="give --profiles with at least one workload")

    def top(attr: str) -> float | None:
        vals = [getattr(p, attr) for p in ps if getattr(p, attr) is not None]
        return max(vals) if vals else None
    base = max(ps, key=lambda p: (p.gpu_util, p.workload))
    return replace(base, workload=label + PRIOR, gpu_util=top("gpu_util") or 100.0,
                   mem_util=top("mem_util") or 0.0, peak_mem_gib=top("peak_mem_gib") or 0.0,
                   power_w=top("power_w"))


def believed_profiles(profiles: Mapping[str, Profile], jobs: Sequence[SimJob],
                      mode: str = "alone") -> dict[str, Profile]:
    """What the scheduler knows before the first job: every profile, less the labels of new
    programs (which, with ``mode`` "share", start under ``prior_profile``); a coarse or wrong
    label's profile is the named workload's own. One dict per policy: the ``Profiler`` fills it
    in as the simulation runs."""
    if mode not in COLD_START_MODES:
        raise InputError(f"--cold-start must be one of {', '.join(COLD_START_MODES)}, got "
                         f"{mode!r}", hint="e.g. --cold-start share")
    out = dict(profiles)
    new = sorted({j.label for j in jobs if j.label and j.label not in profiles})
    for label in new:
        out.pop(label, None)
        if mode == "share":
            out[label] = prior_profile(profiles, label)
    return out


class LabelledTruth:
    """The truth for a policy that may look at it (the oracle), asked by label: a new
    program's label (and its provisional profile's name) is the workload it is; a coarse or
    wrong label names a workload, whose truth it gets (plan() asks by label, so even the
    oracle cannot tell two programs under one label apart)."""

    def __init__(self, truth, jobs: Sequence[SimJob]):
        self.truth = truth
        named = truth.workloads()
        self.alias = {j.label: j.workload for j in jobs if j.label and j.label not in named}
        self.alias.update({k + PRIOR: v for k, v in list(self.alias.items())})

    def speeds(self, names: Sequence[str]) -> tuple[float, ...]:
        return self.truth.speeds([self.alias.get(n, n) for n in names])

    def predict_group(self, profiles: Sequence[Profile]) -> tuple[float, ...]:
        return self.speeds([p.workload for p in profiles])

    def workloads(self) -> set[str]:
        return self.truth.workloads()


class Profiler:
    """The controller's profile step in the simulator (``steps/profile.py``): polled every
    ``poll_s`` of virtual time while a job of a label still to profile runs; such a one-GPU
    job alone on its GPU (or, with ``share``, sharing it: per-process figures) is sampled, and
    after ``samples`` polls its label's profile in ``known`` (the dict the policies read) is the
    workload's own, with the measurements' spread. ``learnt``: label -> virtual time."""

    def __init__(self, known: dict[str, Profile], truth_profiles: Mapping[str, Profile],
                 jobs: Sequence[SimJob], seed: int, share: bool = False,
                 samples: int = PROFILE_SAMPLES, poll_s: float = POLL_S):
        self.known = known
        self.truth_profiles = truth_profiles
        self.share = share
        self.samples = samples
        self.poll_s = poll_s
        self.todo = {j.label for j in jobs if j.label and (
            j.label not in known or known[j.label].workload.endswith(PRIOR))}
        self.rng = random.Random(f"profiler:{seed}")
        self.counts: dict[int, int] = {}
        self.learnt: dict[str, float] = {}
        self._next = 0.0

    def _waiting(self, running: Mapping[int, Job]) -> bool:
        return bool(self.todo) and any(j.spec.workload in self.todo for j in running.values())

    def next_poll(self, t: float, running: Mapping[int, Job]) -> float:
        if not self._waiting(running):
            return math.inf
        if self._next <= t:
            self._next = (math.floor(t / self.poll_s) + 1) * self.poll_s
        return self._next

    def step(self, t: float, running: Mapping[int, Job], on_gpu: Mapping[tuple, list[int]],
             now: Mapping[int, str], paused: set[int] | frozenset[int] = frozenset()) -> bool:
        """At a poll: sample, and record the profiles due; whether any was (the engine then
        re-plans: jobs of that label may share from now on). ``now``: the workload each job
        is (its truth)."""
        if t + 1e-6 < self._next or not self._waiting(running):
            return False
        self._next = (math.floor(t / self.poll_s + 1e-9) + 1) * self.poll_s
        learnt = False
        for ids in on_gpu.values():
            alone = len([i for i in ids if i not in paused]) == 1
            for i in ids:
                job = running.get(i)
                label = job.spec.workload if job is not None else None
                if job is None or label not in self.todo or len(job.gpu_indices) != 1 \
                        or i in paused or not (alone or self.share):
                    continue
                n = self.counts[i] = self.counts.get(i, 0) + 1
                if n >= self.samples:
                    self.known[label] = self._measured(now[i], label)
                    self.todo.discard(label)
                    self.learnt[label] = t
                    learnt = True
        return learnt

    def _measured(self, workload: str, label: str) -> Profile:
        p = self.truth_profiles[workload]

        def j(v: float | None) -> float | None:
            return None if v is None else v * self.rng.uniform(1 - JITTER, 1 + JITTER)
        return replace(p, workload=label, gpu_util=j(p.gpu_util) or 0.0,
                       mem_util=j(p.mem_util) or 0.0, power_w=j(p.power_w))

"""Run-time adaptation, the deciding half: has sharing gone wrong on a GPU, and what to do.

Pure (no I/O, no clock): the controller (``controller/adapt.py``) feeds it each round's observed
speeds and acts on what it says, and a test or the simulator can feed it any sequence.

A *symptom* is what one poll shows on one shared GPU:

- **underperforms**: a job's observed speed is below its predicted speed by more than
  ``AdaptPolicy.margin``, or below its own ``--min-speed`` floor (only when the job gave one:
  the lab's default floor was a placement rule, not the job's wish);
- **worse than serial**: the GPU's jobs' observed speeds sum below 1.0 - ``serial_margin``:
  running them one after the other would finish both sooner.

Noise is not a signal: a symptom becomes a *finding* only once it has lasted ``observe_s``
seconds **and** ``polls`` consecutive polls with the same jobs on the GPU, and a finding ends
only after ``polls`` consecutive polls without it (hysteresis, so a borderline pair does not
flap). A poll where no job on the GPU could be judged (no speeds yet) neither extends nor breaks
a streak. The margins' defaults are several times the +-2% spread of the shipped measurements
(``tests/unit/test_adapt_detect.py`` checks that such jitter finds nothing).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..inventory import AdaptPolicy

UNDERPERFORMS = "underperforms"
WORSE_THAN_SERIAL = "worse than serial"


@dataclass(frozen=True)
class Sharer:
    """One job on a shared GPU, as the detector sees it this poll."""

    job_id: int
    observed: float | None          # this poll's observed speed (None: not measured)
    predicted: float | None         # what placement predicted for it on this GPU
    floor: float | None = None      # its own --min-speed, if it gave one
    joined_at: float = 0.0          # when it started on this GPU (the last to join is suspended)
    adapt: bool = True              # False: --no-adapt, never suspended
    opportunistic: bool = False     # --opportunistic: suspended first, whenever it joined


@dataclass(frozen=True)
class Symptom:
    """What one poll shows on one GPU: the kinds seen and the numbers that show them."""

    kinds: frozenset[str]
    detail: str


@dataclass(frozen=True)
class Finding:
    """A symptom that persisted: the GPU, its jobs, since when, over how many polls."""

    gpu: str
    job_ids: tuple[int, ...]
    kinds: frozenset[str]
    detail: str          # this poll's numbers
    since: float
    polls: int

    @property
    def worse_than_serial(self) -> bool:
        return WORSE_THAN_SERIAL in self.kinds

    def describe(self, now: float) -> str:
        """One line for events and ``queue why``: what, with which numbers, for how long."""
        return (f"{self.gpu} {' and '.join(sorted(self.kinds))}: {self.detail} "
                f"for {now - self.since:.0f} s over {self.polls} polls")


def symptom(sharers: Sequence[Sharer], policy: AdaptPolicy) -> Symptom | None:
    """This poll's symptom on a GPU shared by ``sharers``; None if it shows none, or if no
    job could be judged (then ``Detector`` neither counts nor breaks the streak: see
    ``judgeable``)."""
    kinds: set[str] = set()
    parts: list[str] = []
    for s in sharers:
        if s.observed is None:
            continue
        if s.predicted is not None and s.observed < s.predicted - policy.margin:
            kinds.add(UNDERPERFORMS)
            parts.append(f"job {s.job_id} at {s.observed:.2f} (predicted {s.predicted:.2f}, "
                         f"margin {policy.margin:g})")
        elif s.floor is not None and s.observed < s.floor:
            kinds.add(UNDERPERFORMS)
            parts.append(f"job {s.job_id} at {s.observed:.2f} (its --min-speed {s.floor:g})")
    speeds = [s.observed for s in sharers]
    if len(sharers) > 1 and all(v is not None for v in speeds):
        total = sum(v for v in speeds if v is not None)
        if total < 1.0 - policy.serial_margin:
            kinds.add(WORSE_THAN_SERIAL)
            parts.append("speeds sum to " + "+".join(f"{v:.2f}" for v in speeds if v is not None)
                         + f" = {total:.2f} (< 1.0 - {policy.serial_margin:g}: one after the "
                           "other would be faster)")
    return Symptom(frozenset(kinds), "; ".join(parts)) if kinds else None


def judgeable(sharers: Sequence[Sharer]) -> bool:
    """Whether this poll says anything about the GPU: some job has an observed speed."""
    return any(s.observed is not None for s in sharers)


def last_joined(sharers: Sequence[Sharer]) -> Sharer | None:
    """The job to suspend when the GPU runs worse than serial: an ``--opportunistic`` one
    first, else the one that joined last (its partner was there first and was fine alone),
    skipping ``--no-adapt`` jobs; None if every job opted out."""
    allowed = [s for s in sharers if s.adapt]
    return max(allowed, key=lambda s: (s.opportunistic, s.joined_at, s.job_id)) \
        if allowed else None


@dataclass
class _Streak:
    jobs: tuple[int, ...]
    since: float
    polls: int = 0
    clear: int = 0          # consecutive polls without the symptom while found
    found: Finding | None = None


@dataclass
class Detector:
    """Per-GPU persistence of symptoms.  ``observe`` takes one poll (every shared GPU and its
    jobs) and returns the findings in force after it.  A GPU whose set of jobs changed starts
    over: the finding was about those jobs."""

    _streaks: dict[str, _Streak] = field(default_factory=dict)

    def observe(self, now: float, gpus: Mapping[str, Sequence[Sharer]], policy: AdaptPolicy
                ) -> dict[str, Finding]:
        out: dict[str, Finding] = {}
        for gpu, sharers in gpus.items():
            jobs = tuple(sorted(s.job_id for s in sharers))
            streak = self._streaks.get(gpu)
            if streak is None or streak.jobs != jobs:
                streak = self._streaks[gpu] = _Streak(jobs, now)
            if len(sharers) < 2 or not judgeable(sharers):
                if streak.found is not None:
                    out[gpu] = streak.found
                continue
            seen = symptom(sharers, policy)
            if seen is None:
                streak.clear += 1
                if streak.found is None or streak.clear >= policy.polls:
                    self._streaks[gpu] = _Streak(jobs, now)
                else:
                    out[gpu] = streak.found
                continue
            if streak.polls == 0:
                streak.since = now
            streak.polls += 1
            streak.clear = 0
            if streak.found is not None or (streak.polls >= policy.polls
                                            and now - streak.since >= policy.observe_s):
                streak.found = Finding(gpu, jobs, seen.kinds, seen.detail, streak.since,
                                       streak.polls)
                out[gpu] = streak.found
        for gpu in set(self._streaks) - set(gpus):
            del self._streaks[gpu]
        return out


def closed_gpus(findings: Mapping[str, Finding], now: float, policy: AdaptPolicy
                ) -> dict[str, str]:
    """GPU name -> why it takes no new partners (``plan(closed=...)``): every GPU with a
    finding, while ``stop_partners`` is on."""
    if not (policy.enabled and policy.stop_partners):
        return {}
    return {gpu: f.describe(now) for gpu, f in findings.items()}

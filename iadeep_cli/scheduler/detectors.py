"""Run-time adaptation, the deciding half: has sharing gone wrong on a GPU, and what to do.

Pure (no I/O, no clock): the controller (``steps/adaptation.py``) feeds it each round's
observed speeds and acts on what it says, and a test or the simulator can feed it any sequence.

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
a streak.

A *phase change* (``PhaseDetector``) is about one job's own behaviour: its progress rate, GPU
or memory utilisation moved by more than ``phase_threshold`` (rate, relative) or
``phase_util`` (percentage points) away from how it started and from its workload's profile,
for ``phase_persist_s`` and ``polls`` polls. Alone on its GPU, the GPU's figures are the job's;
sharing it, only its own SM share is (where the poll has per-process figures: NVML or pmon), and
that share over the job's observed speed estimates its utilisation alone (``solo_util``). The
controller then gives the workload a "phase" profile sample, which replaces the profile
instead of being averaged in.

The margins' defaults are several times the +-2% spread of the shipped measurements
(``tests/unit/test_adapt_detect.py`` checks that such jitter finds nothing).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median

from ..settings import AdaptPolicy

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
    """GPU name -> why it takes no new partners (``PlanInputs.closed``): every GPU with a
    finding, while ``stop_partners`` is on."""
    if not (policy.enabled and policy.stop_partners):
        return {}
    return {gpu: f.describe(now) for gpu, f in findings.items()}


# ---------------------------------------------------------------------------------------------
# Phase change: a job that no longer behaves like its workload's profile.
# ---------------------------------------------------------------------------------------------
RATE = "rate"          # progress rate, iterations/s
UTIL = "gpu_util"      # GPU (SM) utilisation, %
MEM = "mem_util"       # memory-bandwidth utilisation, %


MIN_SHARED_SPEED = 0.1   # slower than this while sharing (a stall, a checkpoint): no estimate
# The observer caps a speed here (controller/round/observer.py): a speed at the cap is only a floor
# (the job outran the rate it is measured against), so it gives no estimate.
SPEED_CAP = 1.5


def solo_util(sm_share: float | None, speed: float | None) -> float | None:
    """A sharing job's GPU utilisation alone (%), estimated from its own SM share of the GPU
    (NVML's or pmon's per-process figure) and its observed speed relative to alone:
    time-sliced, a job doing ``speed`` of its solo work keeps the SMs busy about ``speed``
    times as long as alone.
    None where either is missing, the job nearly stalled (the quotient is then noise) or its
    speed is at the observer's cap (``SPEED_CAP``: not a measurement)."""
    if sm_share is None or speed is None or not MIN_SHARED_SPEED <= speed < SPEED_CAP:
        return None
    return min(100.0, sm_share / speed)


@dataclass(frozen=True)
class Solo:
    """One job's signature alone, as the phase detector sees it this poll: what it shows now
    (None: not measured this poll) and what its workload's profile in effect says (None: the
    profile does not say). ``sharing``: the job shares its GPU, so ``util`` is the estimate
    ``solo_util`` and rate and memory are not its own (None)."""

    job_id: int
    workload: str
    rate: float | None = None
    util: float | None = None
    mem: float | None = None
    profile_rate: float | None = None
    profile_util: float | None = None
    profile_mem: float | None = None
    adapt: bool = True          # False: --no-adapt, never acted on
    sharing: bool = False
    # ``util`` estimated with a speed relative to the solo rate the lab profiled for the
    # workload, not the job's own (not yet measured alone): a job of another batch size runs
    # at another rate, which skews such an estimate by the ratio of the two rates, so it is
    # compared only with the job's earlier such estimates (a start of their own), never with
    # values measured alone or estimated against its own rate
    provisional: bool = False


@dataclass(frozen=True)
class PhaseChange:
    """A job whose behaviour alone moved, persistently, away from how it started *and* from its
    workload's profile: ``old`` what the profile says, ``new`` what the job shows now (the
    median of the streak's polls), per metric that moved."""

    job_id: int
    workload: str
    old: dict[str, float]
    new: dict[str, float]
    since: float
    polls: int
    sharing: bool = False    # seen while sharing its GPU (its utilisation alone estimated)

    def describe(self, now: float) -> str:
        moved = "; ".join(f"{_METRIC_TEXT[k]} {_fmt(k, self.old[k])} -> {_fmt(k, v)}"
                          for k, v in sorted(self.new.items()))
        where = ("sharing its GPU (utilisation alone estimated from its own SM share and "
                 "speed)" if self.sharing else "alone")
        return (f"phase change: job {self.job_id} ({self.workload}) {where}: {moved} "
                f"for {now - self.since:.0f} s over {self.polls} polls")


_METRIC_TEXT = {RATE: "progress rate", UTIL: "GPU utilisation", MEM: "memory utilisation"}


def _fmt(metric: str, value: float) -> str:
    return f"{value:.3g} it/s" if metric == RATE else f"{value:.0f}%"


def _moved(metric: str, before: float | None, now: float, policy: AdaptPolicy) -> bool:
    if before is None:
        return False
    if metric == RATE:
        return before > 0 and abs(now / before - 1.0) > policy.phase_threshold
    return abs(now - before) > policy.phase_util


def _values(s: Solo) -> dict[str, float]:
    return {k: v for k, v in ((RATE, s.rate), (UTIL, s.util), (MEM, s.mem)) if v is not None}


def _profile_of(s: Solo) -> dict[str, float | None]:
    return {RATE: s.profile_rate, UTIL: s.profile_util, MEM: s.profile_mem}


def phase_shift(solo: Solo, start: Mapping[str, float], policy: AdaptPolicy
                ) -> dict[str, float]:
    """This poll's metrics that moved by more than the lab's threshold both from how the job
    started (``start``: its first values alone) and from its profile (where the profile says
    anything about that metric: a shipped profile has no rate); {} if none did.  Both,
    so a job that always differed from its label's profile (another batch size) is not a
    phase change, and one that merely came back to its profile (after a warm-up) is not
    either."""
    prof = _profile_of(solo)
    return {k: v for k, v in _values(solo).items()
            if _moved(k, start.get(k), v, policy)
            and (prof[k] is None or _moved(k, prof[k], v, policy))}


@dataclass
class _PhaseStreak:
    since: float = 0.0
    polls: int = 0
    seen: dict[str, list[float]] = field(default_factory=dict)
    provisional: bool = False   # of provisional estimates (``Solo.provisional``)


@dataclass
class PhaseDetector:
    """Per job: its first values alone (its starting phase) and the current streak of polls
    showing a phase shift.  ``observe`` takes one poll (each job's signature alone: measured
    alone, or estimated while sharing) and
    returns the phase changes that just became findings: each is reported once, after which
    the job's new values are its starting point (the caller refreshes the profile; if it could
    not, the same change is not reported again).  Like ``Detector``: a shift counts once it
    lasted ``phase_persist_s`` seconds **and** ``polls`` consecutive polls; a poll without it
    breaks the streak; a poll where the job is absent (no signature of its own: sharing on a
    node without per-process figures) or shows nothing measured neither extends nor breaks
    it, and jobs that ended are forgotten."""

    _start: dict[int, dict[str, float]] = field(default_factory=dict)
    # per job: its first provisional estimates (``Solo.provisional``), their own start
    _provisional: dict[int, dict[str, float]] = field(default_factory=dict)
    _streaks: dict[int, _PhaseStreak] = field(default_factory=dict)

    def begin(self, job_id: int, values: Mapping[str, float], provisional: bool = False
              ) -> dict[str, float]:
        """Record what a job's first values are (its starting phase; a metric seen before
        keeps its first value) and return them all: each poll does this, and the simulator
        does it when it places a job (its label's profile says how it starts).
        ``provisional`` estimates (``Solo.provisional``) have a start of their own."""
        starts = self._provisional if provisional else self._start
        start = starts.setdefault(job_id, {})
        for k, v in values.items():
            start.setdefault(k, v)
        return start

    def start_of(self, job_id: int) -> Mapping[str, float]:
        """A job's starting values (measured alone or estimated against its own rate)."""
        return self._start.get(job_id, {})

    def observe(self, now: float, solos: Sequence[Solo], policy: AdaptPolicy,
                alive: set[int] | None = None) -> list[PhaseChange]:
        out: list[PhaseChange] = []
        for s in solos:
            values = _values(s)
            if not values:
                continue
            start = self.begin(s.job_id, values, s.provisional)
            if not (policy.enabled and policy.phase and s.adapt):
                continue
            moved = phase_shift(s, start, policy)
            if not moved:
                self._streaks.pop(s.job_id, None)
                continue
            streak = self._streaks.get(s.job_id)
            if (streak is None or set(streak.seen) != set(moved)
                    or streak.provisional != s.provisional):
                streak = self._streaks[s.job_id] = _PhaseStreak(since=now,
                                                                provisional=s.provisional)
            streak.polls += 1
            for k, v in moved.items():
                streak.seen.setdefault(k, []).append(v)
            if streak.polls >= policy.polls and now - streak.since >= policy.phase_persist_s:
                new = {k: median(vs) for k, vs in streak.seen.items()}
                prof = _profile_of(s)
                old = {k: p if (p := prof[k]) is not None else start[k] for k in new}
                out.append(PhaseChange(s.job_id, s.workload, old, new, streak.since,
                                       streak.polls, s.sharing))
                start.update(new)
                del self._streaks[s.job_id]
        if alive is not None:
            for gone in (set(self._start) | set(self._provisional)) - alive:
                self._start.pop(gone, None)
                self._provisional.pop(gone, None)
                self._streaks.pop(gone, None)
        return out


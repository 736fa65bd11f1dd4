"""How good forecasts are: ``iadeep sim --forecast`` scores them in the simulator.

One simulation of the iadeep policy per seed, its planner wrapped (``Scorer``): at each
submission the queue as the scheduler sees it is forecast (``scheduler.forecast``, as the
controller does) twice:

- **iadeep**: the same plan(), run-time estimates from the history the simulation has built
  so far (``estimate_runtime``: the lab's finished runs, capped by the job's --time), the
  predictor's speeds for jobs that would share;
- **slurm**: what ``squeue --start`` does: every job runs exactly its time limit, nothing
  slows anything (the same plan(), so only the run times and the interference differ).

Simulated jobs have no --time of their own: each gets one, ``limit_for`` (an assumption about
users, not a measurement: 1.2 to 4 times what the job needs alone, log-uniform, rounded up to
whole hours). Both forecasts see the same limits; the schedule itself does not (plan() places
as in a plain ``iadeep sim``).

Scored: the submitted job's forecast start against its actual start, and for up to
``RUNNING_SAMPLES`` running jobs per submission their forecast end against their actual end.
Running jobs in the simulator report no progress, so the end forecasts are from run-time
estimates alone (a controller with jobs reporting progress has more to go by).
"""
from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..jobs import Job
from ..profiles import Profile
from ..scheduler import forecast as fc
from ..scheduler.placement import GpuSlot, Plan, spec_memory_mib
from ..scheduler.prediction import CachedModel, Predictor
from ..scheduler.remaining import RuntimeEstimate, estimate_runtime
from ..settings import Policy
from .engine import PolicyResult, SimJob
from .policies import SimPlanner

RUNNING_SAMPLES = 3          # running jobs whose end is scored at each submission
LIMIT_FACTOR = (1.2, 4.0)    # a job's --time: this many times its solo run time (log-uniform),
LIMIT_ROUND_S = 3600.0       # rounded up to whole hours
WITHIN_REL = 0.30            # "within +-30%" (of the actual wait, of the remaining time)
BAR_REL = 0.20               # the goal for ends: "within 20%" (the median is when half are)
WITHIN_S = 900.0             # "within 15 minutes"
WAITED_S = 60.0              # a job "waited" when it started more than a minute after submission
# iadeep+progress: iadeep's forecast when running jobs report their progress and total
# (their solo work left is then known: the simulator's own figure, within PROGRESS_LOW/HIGH)
METHODS = ("iadeep", "iadeep+progress", "slurm")


def limit_for(job: SimJob, seed: int) -> float:
    """The --time the simulated job's user asked for (see the module docstring)."""
    rng = random.Random(f"limit:{seed}:{job.id}")
    lo, hi = LIMIT_FACTOR
    f = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return math.ceil(job.duration_s * f / LIMIT_ROUND_S) * LIMIT_ROUND_S


@dataclass
class Samples:
    """Forecast against actual, per method: (forecast, actual, reference) where reference is
    the submission time (starts) or the time the forecast was made (ends)."""

    starts: dict[str, list[tuple[float | None, int, float]]] = field(
        default_factory=lambda: {m: [] for m in METHODS})
    ends: dict[str, list[tuple[float | None, int, float]]] = field(
        default_factory=lambda: {m: [] for m in METHODS})


class _Work:
    """The run-time hooks of the iadeep policy, passed through, and each job's solo work done
    so far, integrated from the speeds the engine hands ``step`` (the speeds in effect since
    its last event): what a job reporting its progress tells the controller."""

    def __init__(self, hooks):
        self.inner = hooks
        self.done: dict[int, float] = {}
        self.since: dict[int, float] = {}   # when each job was placed (the scorer sets it)
        self._last: dict[int, float] = {}

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def step(self, t, running, on_gpu, phases, speed, factor_on=None):
        for i in running:
            start = self._last.get(i, self.since.get(i, t))
            if t > start:
                self.done[i] = self.done.get(i, 0.0) + speed.get(i, 0.0) * (t - start)
            self._last[i] = t
        return self.inner.step(t, running, on_gpu, phases, speed, factor_on)


class Scorer(SimPlanner):
    """The iadeep planner, unchanged, with forecasts made at each submission."""

    def __init__(self, inner: SimPlanner, profiles: Mapping[str, Profile], model: Predictor,
                 limits: Mapping[int, float], seed: int, policy: Policy,
                 solo: Mapping[int, float] | None = None):
        super().__init__(inner.fn, inner.view)
        # every submission is forecast, so no round may be skipped as "every GPU full" (the
        # engine's shortcut): the plan is the same either way, the forecast needs the call
        self.full = None
        self.work = _Work(inner.hooks) if inner.hooks is not None else None
        self.hooks = self.work if self.work is not None else inner.hooks
        # job id -> its solo run time (the trace's): what a job reporting its total knows
        self.solo: Mapping[int, float] = solo or {}
        self.profiles = profiles
        self.model = CachedModel(model)
        self.limits = limits
        self.samples = Samples()
        self.started: dict[int, float] = {}
        self._seen: set[int] = set()
        self._rng = random.Random(f"forecast-samples:{seed}")
        self.policy = policy

    def __call__(self, queue, slots, active, now, fairshare=None) -> Plan:
        new = [j.id for j in queue if j.id not in self._seen]
        if new:
            self._seen.update(new)
            self._forecast(list(queue), slots, list(active), now, fairshare, new)
        got = self.fn(queue, slots, active, now, fairshare)
        for p in got.placements:
            self.started.setdefault(p.job_id, now)
            if self.work is not None:
                self.work.since.setdefault(p.job_id, now)
        return got

    def _forecast(self, queue: list[Job], slots: Sequence[GpuSlot], active: list[Job],
                  now: float, fairshare, new: list[int]) -> None:
        def decide(q: Sequence[Job], s: Sequence[GpuSlot], a: Sequence[Job], t: float) -> Plan:
            return self.fn(list(q), tuple(s), list(a), t, fairshare)

        durations = self.view.durations
        limits = self.limits
        memo: dict[tuple, RuntimeEstimate] = {}

        def runtime(job: Job) -> RuntimeEstimate:
            key = (job.owner, job.spec.workload, limits[job.id])
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = estimate_runtime(durations, user=job.owner,
                                                   workload=job.spec.workload,
                                                   time_limit_s=limits[job.id])
            return hit

        def left(job: Job) -> fc.Left:
            age = 0.0 if job.started_at is None else max(0.0, now - job.started_at)
            est = estimate_runtime(durations, user=job.owner, workload=job.spec.workload,
                                   time_limit_s=limits[job.id], age_s=age)
            return fc.Left(est.left_s(age), max(0.0, est.low_s - age),
                           max(0.0, est.high_s - age), est.source)

        work = self.work

        def progress_left(job: Job) -> fc.Left:
            if work is None or job.id not in self.solo:
                return left(job)
            s = max(0.0, self.solo[job.id] - work.done.get(job.id, 0.0))
            return fc.Left(s, s * fc.PROGRESS_LOW, s * fc.PROGRESS_HIGH, "progress")

        def slurm_runtime(job: Job) -> RuntimeEstimate:
            lim = limits[job.id]
            return RuntimeEstimate(lim, lim, lim, "--time")

        def slurm_left(job: Job) -> fc.Left:
            began = now if job.started_at is None else job.started_at
            s = max(0.0, limits[job.id] - (now - began))
            return fc.Left(s, s, s, "--time")

        def alone(jobs: Sequence[Job]) -> Sequence[float]:
            return (1.0,) * len(jobs)

        policy = self.policy

        def memory(job: Job) -> float | None:
            return spec_memory_mib(job.spec, self.profiles, policy)

        picks = self._rng.sample(active, min(RUNNING_SAMPLES, len(active)))
        for method, rt, lf, speeds in (
                ("iadeep", runtime, left, fc.speeds_of(self.profiles, self.model)),
                ("iadeep+progress", runtime, progress_left,
                 fc.speeds_of(self.profiles, self.model)),
                ("slurm", slurm_runtime, slurm_left, alone)):
            got = fc.forecast(queue, slots, active, now=now, decide=decide, left=lf,
                              runtime=rt, group_speed=speeds, memory=memory)
            for i in new:
                f = got.jobs.get(i)
                self.samples.starts[method].append((None if f is None else f.start, i, now))
            for job in picks:
                f = got.jobs.get(job.id)
                self.samples.ends[method].append((None if f is None else f.end, job.id, now))


@dataclass(frozen=True)
class Score:
    """One method's accuracy: ``n`` forecasts scored (``unforeseen``: with no forecast),
    the median absolute error in hours, that error over the median actual wait (starts) or
    remaining time (ends), the share within +-30% of it and within 15 minutes, and the share
    within +-20% (the goal for running jobs' ends: met when it is at least half)."""

    n: int
    unforeseen: int
    median_abs_error_h: float
    median_rel_error: float       # median of |error| / actual wait (or remaining time)
    error_over_median_wait: float  # median |error| / median actual wait (or remaining)
    within_30pct: float
    within_15min: float
    within_20pct: float = 0.0   # the share within +-20% (BAR_REL): the median is when >= 50%

    def to_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def score(samples: Sequence[tuple[float | None, object, float]], actual: Mapping[object, float],
          min_span_s: float = 0.0) -> Score:
    """``min_span_s``: only forecasts whose actual wait (or remaining time) was longer."""
    errors, spans, rels = [], [], []
    near = close = bar = unforeseen = n = 0
    for got, job_id, ref in samples:
        if job_id not in actual:
            continue
        truth = actual[job_id]
        span = max(0.0, truth - ref)
        if span < min_span_s:
            continue
        n += 1
        if got is None or not math.isfinite(got):
            unforeseen += 1
            continue
        err = abs(got - truth)
        errors.append(err)
        spans.append(span)
        rels.append(err / span if span > 0 else (0.0 if err < 1.0 else math.inf))
        near += err <= WITHIN_REL * span + 1.0
        bar += err <= BAR_REL * span + 1.0
        close += err <= WITHIN_S
    if not errors:
        return Score(n, unforeseen, math.nan, math.nan, math.nan, 0.0, 0.0, 0.0)
    med_span = statistics.median(spans)
    med = statistics.median(errors)
    return Score(n, unforeseen, med / 3600.0, statistics.median(rels),
                 med / med_span if med_span > 0 else math.nan, near / n, close / n, bar / n)


@dataclass(frozen=True)
class ForecastReport:
    """Per method, start and end scores (pooled over the seeds), and the settings."""

    starts: dict[str, Score]
    ends: dict[str, Score]
    waited: dict[str, Score]   # starts of the jobs that waited (more than WAITED_S)
    seeds: tuple[int, ...]
    load: float
    jobs: int
    gpus: int
    trace: str | None = None   # the trace replayed (then ``load`` says nothing)

    def to_dict(self) -> dict:
        return {"load": None if self.trace else self.load, "trace": self.trace,
                "seeds": list(self.seeds), "jobs": self.jobs, "gpus": self.gpus,
                "start": {m: s.to_dict() for m, s in self.starts.items()},
                "start_waited": {m: s.to_dict() for m, s in self.waited.items()},
                "end_running": {m: s.to_dict() for m, s in self.ends.items()}}


def run_forecast(jobs: Sequence[SimJob], seed: int,
                 simulate_with: Callable[[Scorer], PolicyResult], planner: SimPlanner,
                 profiles: Mapping[str, Profile], model: Predictor, policy: Policy
                 ) -> tuple[Samples, dict[int, float], dict[int, float]]:
    """One seed: the simulation with forecasts; (samples, actual starts, actual ends)."""
    limits = {j.id: j.time_limit_s or limit_for(j, seed) for j in jobs}
    scorer = Scorer(planner, profiles, model, limits, seed, policy,
                    {j.id: j.duration_s for j in jobs})
    result = simulate_with(scorer)
    # the engine reports each finished job's JCT in the trace's order; every job finishes (the
    # simulation runs until none is left)
    done = list(jobs)
    if len(result.jcts) != len(done):
        raise RuntimeError("forecast scoring needs every job of the trace to finish")
    ends = {j.id: j.submit_s + jct for j, jct in zip(done, result.jcts)}
    return scorer.samples, dict(scorer.started), ends


def pooled(parts: Sequence[tuple[Samples, dict[int, float], dict[int, float]]], seeds,
           load: float, n_jobs: int, gpus: int) -> ForecastReport:
    """Scores over every seed's samples (job ids are per seed: scored seed by seed, pooled)."""
    starts: dict[str, list] = {m: [] for m in METHODS}
    ends: dict[str, list] = {m: [] for m in METHODS}
    actual_s: dict[object, float] = {}
    actual_e: dict[object, float] = {}
    for k, (samples, started, ended) in enumerate(parts):
        for m in METHODS:
            starts[m] += [(g, (k, i), r) for g, i, r in samples.starts[m]]
            ends[m] += [(g, (k, i), r) for g, i, r in samples.ends[m]]
        actual_s.update({(k, i): t for i, t in started.items()})
        actual_e.update({(k, i): t for i, t in ended.items()})
    return ForecastReport({m: score(starts[m], actual_s) for m in METHODS},
                          {m: score(ends[m], actual_e) for m in METHODS},
                          {m: score(starts[m], actual_s, WAITED_S) for m in METHODS},
                          tuple(seeds), load, n_jobs, gpus)


def format_report(r: ForecastReport) -> str:
    what = f"trace {r.trace}" if r.trace else f"load {r.load:g}"
    lines = [f"forecast accuracy: {what}, seeds {', '.join(map(str, r.seeds))}, "
             f"{r.jobs} jobs on {r.gpus} GPUs per seed",
             f"{'':<22}{'method':<16}{'n':>6}{'median |err|':>14}{'/ median':>10}"
             f"{'median rel':>11}{'<=30%':>7}{'<=20%':>7}{'<=15min':>9}"]
    for what, scores in (("start (at submission)", r.starts),
                         ("start, jobs that wait", r.waited),
                         ("end (running jobs)", r.ends)):
        for m, s in scores.items():
            over = "-" if math.isnan(s.error_over_median_wait) else \
                f"{s.error_over_median_wait:.2f}"
            lines.append(f"{what:<22}{m:<16}{s.n:>6}{s.median_abs_error_h:>12.2f}h "
                         f"{over:>9}{s.median_rel_error:>11.2f}"
                         f"{s.within_30pct:>7.0%}{s.within_20pct:>7.0%}"
                         f"{s.within_15min:>9.0%}")
            what = ""
    lines.append("(/ median: the median |error| over the median actual wait, or remaining "
                 "time for ends; median rel: the median of each |error| over its own; "
                 "<=20%: the share within 20% of it, at least half when median rel <= 0.2)")
    return "\n".join(lines)


def forecast_report(settings, seeds: int, progress: Callable[[str], None] | None = None,
                    inputs=None) -> ForecastReport:
    """``iadeep sim --forecast``: the iadeep policy over ``seeds`` seeds from
    ``settings.seed``, forecasts scored, pooled over the seeds."""
    from dataclasses import replace

    from .engine import _mem_mib, simulate
    from .policies import make_planner
    from .run import build_trace, load_inputs

    profiles, truth, model = inputs if inputs is not None else load_inputs(settings)
    parts = []
    used = tuple(range(settings.seed, settings.seed + max(1, seeds)))
    n_jobs = 0
    for seed in used:
        s = replace(settings, seed=seed)
        # each job's assumed --time travels with it, so the run-time history the simulation
        # builds as jobs finish learns run time over --time as the controller's does
        jobs = [replace(j, time_limit_s=limit_for(j, seed))
                for j in build_trace(s, profiles, truth)]
        n_jobs = len(jobs)
        pol = replace(s.policy, fairshare=None)
        mem = {j.id: _mem_mib(j, profiles, pol) for j in jobs}
        planner = make_planner("iadeep", profiles, model, truth, pol, mem, seed)

        def run(scorer: Scorer, _jobs=jobs, _pol=pol) -> PolicyResult:
            return simulate(_jobs, scorer, truth, gpus=settings.gpus,
                            gpus_per_node=settings.gpus_per_node,
                            policy=_pol, profiles=profiles, name="iadeep")
        parts.append(run_forecast(jobs, seed, run, planner, profiles, model, pol))
        if progress is not None:
            progress(f"load {s.load:g} seed {seed}: done")
    return replace(pooled(parts, used, settings.load, n_jobs, settings.gpus),
                   trace=settings.trace)

"""When queued jobs are expected to start and end: the queue simulated forward, pure.

The forecast replays what the scheduler itself would do: from the GPUs as they are now, the
running jobs end one after another (each at its expected end), and at each end the same
``plan()`` the round calls (``decide``, bound by the caller to the lab's settings: policy,
predictor, fair share, reservations, run-time history) places what it would place. A job
placed in the forecast runs for its run-time estimate (``runtime``: ``--time``, else the lab's
history for its owner and label, else the stated default; ``remaining.estimate_runtime``)
at the speed the predictor gives its GPU's group (``group_speed``), so a job that would share
takes longer, and its partner too.

Each job gets a range as well as a figure: the start and end it would have if every run time
were at its low (10%) or high (90%) quantile. The low and high bounds are carried through the
same simulation (a GPU frees at its last job's low and high end; a job placed when a GPU
freed starts within that GPU's bounds), not by simulating three times.

Bounded in cost (a 1,000-job queue on 512 GPUs well under a second, benchmarks/
bench_forecast.py): ends that fall close together are taken as one step (within ``QUANTUM``
of the forecast's elapsed time, at least ``MIN_STEP_S``), each step's ``plan()`` runs as the
simulator's does (``reasons=False``: it stops once no GPU has room, and gives no waiting
reasons, which the forecast does not read) over the whole queue (``window`` can bound it to
the head; the whole queue is what lets a small job forecast to backfill past a long head), and
the forecast stops after ``MAX_STEPS`` steps or ``HORIZON_S``: a job not placed by then has no
forecast ("not within the horizon"). These are approximations, stated in
docs/scheduling.md: jobs not yet submitted are not foreseen (they may jump ahead with a higher
priority), nor are failures, cancellations, holds or nodes going down.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..jobs import Job, JobState
from ..messages import ForecastView
from ..profiles import Profile
from ..settings import Policy
from .inputs import PlanInputs
from .placement import GpuSlot, Plan, plan
from .prediction import CachedModel, Predictor
from .priority import order_queue
from .remaining import Durations, RuntimeEstimate, estimate_runtime

QUANTUM = 0.03        # ends within 3% of the time forecast so far are one step ...
MIN_STEP_S = 60.0     # ... and ends within a minute
WINDOW: int | None = None   # queued jobs each step's plan() sees, at least (None: all)
MAX_STEPS = 400
HORIZON_S = 30 * 86400.0

Decide = Callable[[Sequence[Job], Sequence[GpuSlot], Sequence[Job], float], Plan]


@dataclass(frozen=True)
class Left:
    """A running job's solo work still to do (seconds at full speed): the median, low and high
    figures, and what they rest on ("progress", "--time", "label history", ...)."""

    seconds: float
    low_s: float
    high_s: float
    source: str


@dataclass(frozen=True)
class JobForecast(ForecastView):
    """One job's forecast: the figures a reader is shown (``messages.ForecastView``: times are
    epoch seconds; ``start`` None: a queued job not placed within the horizon; ``node``/
    ``gpus``: where it would start; ``beside``: the jobs already on those GPUs then;
    ``speed``: its predicted speed there, 1.0 alone; ``source``: what its run time rests on)
    and whose it is. A running job has ``start`` = its real start and only the end forecast.
    ``ForecastView.at(made_at)`` is what a reply carries; JSON by the same codec."""

    job_id: int = field(kw_only=True)

    @property
    def where(self) -> str:
        if self.node is None:
            return ""
        return f"{self.node}:{','.join(str(i) for i in self.gpus)}"


@dataclass(frozen=True)
class Forecast:
    """Every job's forecast at ``made_at``; ``steps``: the plan() calls it took; ``cut``: it
    stopped at ``MAX_STEPS`` or ``HORIZON_S`` with jobs still waiting."""

    made_at: float
    jobs: Mapping[int, JobForecast]
    steps: int = 0
    cut: bool = False


class _Run:
    __slots__ = ("job", "left", "lo", "hi", "speed", "start", "base", "start_lo", "start_hi",
                 "mem", "elapsed")

    def __init__(self, job: Job, left: Left, start: float, start_lo: float, start_hi: float,
                 mem: float):
        self.job = job
        self.left = max(0.0, left.seconds)      # median solo work left
        # the low and high figures as ratios of the median (kept through speed changes)
        base = max(left.seconds, 1e-9)
        self.lo = max(0.0, left.low_s) / base
        self.hi = max(0.0, left.high_s) / base
        self.speed = 1.0
        self.start = start   # its (forecast) start, as reported
        self.base, self.start_lo, self.start_hi = start, start_lo, start_hi   # bounds from here
        self.mem = mem
        self.elapsed = 0.0   # wall seconds it has run in the forecast


def forecast(queue: Sequence[Job], slots: Sequence[GpuSlot], active: Sequence[Job], *,
             now: float, decide: Decide, left: Callable[[Job], Left],
             runtime: Callable[[Job], RuntimeEstimate],
             group_speed: Callable[[Sequence[Job]], Sequence[float]],
             memory: Callable[[Job], float | None],
             order: Callable[[Sequence[Job], float], list[Job]] | None = None,
             max_steps: int = MAX_STEPS, horizon_s: float = HORIZON_S,
             window: int | None = WINDOW, lag_s: float = 0.0) -> Forecast:
    """Forecast ``queue`` (the jobs ``plan()`` may place: dependencies met) from the GPUs
    ``slots`` with ``active`` on them, at ``now``.

    ``decide(queue, slots, active, t)``: plan() with the lab's settings; ``left(job)``: a
    running job's solo work still to do; ``runtime(job)``: a queued job's run time (solo
    seconds); ``group_speed(jobs)``: each job's predicted speed when ``jobs`` share a GPU (in
    order; one job alone: 1.0); ``memory(job)``: the GPU memory (MiB) it takes on each of its
    GPUs, as plan() counts it; ``order(jobs, t)``: the queue order (default
    ``order_queue`` with the default policy: pass the lab's). ``lag_s``: how long the
    scheduler takes from a GPU freeing to the next job running there (noticing the end,
    a round, the launch: the controller passes a few of its round periods); a start after
    now is reported that much later, and its high bound three times that (a job stopped
    at its --time takes a stop command and a poll more)."""
    slot_by = {(s.node, s.index): s for s in slots}
    free = {k: s.memory_free_mib for k, s in slot_by.items()}
    on: dict[tuple[str, int], list[int]] = {k: [] for k in slot_by}
    # when each GPU last emptied, low/high (a job placed on it starts within these)
    freed: dict[tuple[str, int], tuple[float, float]] = dict.fromkeys(slot_by, (now, now))
    running: dict[int, _Run] = {}
    out: dict[int, JobForecast] = {}
    for job in active:
        if job.node is None:
            continue
        keys = [(job.node, i) for i in job.gpu_indices if (job.node, i) in slot_by]
        # its end bounds run from now (its work left is what is uncertain), its start stays
        run = _Run(job, left(job), now, now, now, 0.0)
        run.start = job.started_at if job.started_at is not None else now
        running[job.id] = run
        for k in keys:
            on[k].append(job.id)
    _speeds(running, on, group_speed, list(on))
    rank = order or (lambda jobs, t: order_queue(jobs, _DEFAULT_POLICY, t, None))
    waiting = {j.id: j for j in queue}
    head = rank(list(queue), now)
    t, steps, cut = now, 0, False
    trigger = (now, now)
    opened = len(slot_by)   # GPUs that freed at this step (the first step: all may have room)
    while waiting:
        if steps >= max_steps or t - now > horizon_s:
            cut = True
            break
        steps += 1
        # plan() over the queue (its head with a ``window``; the first step over all of it,
        # as the round itself sees it), on the GPUs as the forecast has them at t
        size = len(head) if window is None or steps == 1 else max(window, 2 * opened)
        view = [j for j in head if j.id in waiting][:size]
        cur = tuple(replace(s, memory_free_mib=free[k], job_ids=tuple(sorted(on[k])))
                    for k, s in slot_by.items())
        actives = [r.job for r in running.values()]
        placed = decide(view, cur, actives, t).placements
        touched: list[tuple[str, int]] = []
        for p in placed:
            if p.job_id not in waiting:
                continue
            job = waiting.pop(p.job_id)
            keys = [(p.node, i) for i in p.gpu_indices]
            beside = tuple(sorted({o for k in keys for o in on.get(k, ())}))
            # its start range: the bounds of the GPUs it takes if one just freed, else the
            # bounds of what ended at this step
            lo = max((freed[k][0] for k in keys if k in freed), default=trigger[0])
            hi = max((freed[k][1] for k in keys if k in freed), default=trigger[1])
            if beside or t == now:
                lo, hi = (t, t) if t == now else trigger
            lo, hi = min(lo, t), max(hi, t)
            est = runtime(job)
            job = replace(job, state=JobState.RUNNING, node=p.node,
                          gpu_indices=tuple(p.gpu_indices), started_at=t)
            mem = memory(job) or 0.0
            run = _Run(job, Left(est.seconds, est.low_s, est.high_s, est.source), t, lo, hi,
                       mem)
            running[job.id] = run
            for k in keys:
                on[k].append(job.id)
                if free.get(k) is not None:
                    free[k] = (free[k] or 0.0) - mem
                touched.append(k)
            if t > now:   # noticing the end and launching take the scheduler a while
                run.start, run.start_hi = t + lag_s, hi + 3 * lag_s
                hi = run.start_hi
            out[job.id] = JobForecast(run.start, lo, hi, None, None, None, p.node,
                                      tuple(p.gpu_indices), beside,
                                      p.predicted_speeds.get(job.id), est.source, job_id=job.id)
        if touched:
            _speeds(running, on, group_speed, touched)
        if not waiting:
            break
        # the next step: the next end, and every end within the quantum after it
        ends = [(t + r.left / r.speed, i) for i, r in running.items() if r.speed > 0]
        if not ends:
            break   # nothing runs and nothing could be placed: the rest never start here
        first = min(e for e, _ in ends)
        until = first + max(MIN_STEP_S, QUANTUM * (first - now))
        _advance(running, first - t)   # everyone runs to the first end ...
        t = first
        done = [i for e, i in ends if e <= until]
        # ... and the ones ending within the quantum end now (their last bit of work is
        # taken as done: the forecast is that coarse)
        lows, highs, opened_keys = [], [], []
        for i in done:
            r = running.pop(i)
            lo, hi = _bounds(r, t)
            lows.append(lo)
            highs.append(hi)
            if r.job.id in out:   # placed in the forecast (its start shifted by the lag)
                out[r.job.id] = replace(out[r.job.id], end=t + max(0.0, r.start - r.base),
                                        end_low=lo, end_high=hi)
            else:
                out[r.job.id] = _running_end(r, t, lo, hi)
            for k in _keys_of(r, on):
                on[k].remove(i)
                if free.get(k) is not None:
                    free[k] = (free[k] or 0.0) + r.mem
                if not on[k]:
                    freed[k] = (lo, hi)
                opened_keys.append(k)
        trigger = (min(lows), max(highs)) if lows else (t, t)
        opened = len(set(opened_keys))
        _speeds(running, on, group_speed, opened_keys)
    # the rest still running: their ends at the speed they have now (no more arrivals)
    for i, r in running.items():
        end = t + r.left / r.speed if r.speed > 0 else math.inf
        lo, hi = _bounds(r, end)
        if i in out:
            out[i] = replace(out[i], end=end + max(0.0, r.start - r.base), end_low=lo,
                             end_high=hi)
        else:
            out[i] = _running_end(r, end, lo, hi)
    for i in waiting:
        out[i] = JobForecast(None, None, None, None, None, None, job_id=i)
    return Forecast(now, out, steps, cut)


def _running_end(r: _Run, end: float, lo: float, hi: float) -> JobForecast:
    job = r.job
    return JobForecast(r.start, r.start, r.start, end, lo, hi, job.node,
                       tuple(job.gpu_indices), (), None, "", job_id=job.id)


def _bounds(r: _Run, end: float) -> tuple[float, float]:
    """The low and high end of a job that ends at ``end`` (median): its start bounds plus its
    run time in the forecast scaled by its low and high run-time ratios."""
    ran = max(0.0, end - r.base)
    return r.start_lo + ran * min(1.0, r.lo), r.start_hi + ran * max(1.0, r.hi)


def _advance(running: Mapping[int, _Run], dt: float) -> None:
    if dt <= 0:
        return
    for r in running.values():
        r.left = max(0.0, r.left - r.speed * dt)
        r.elapsed += dt


def _keys_of(r: _Run, on: Mapping[tuple[str, int], list[int]]) -> list[tuple[str, int]]:
    node = r.job.node
    return [(node, g) for g in r.job.gpu_indices if (node, g) in on] if node else []


def _speeds(running: dict[int, _Run], on: Mapping[tuple[str, int], list[int]],
            group_speed: Callable[[Sequence[Job]], Sequence[float]],
            keys: Sequence[tuple[str, int]]) -> None:
    """The predicted speed of the jobs on the GPUs ``keys`` (a job on several GPUs: its
    slowest GPU's)."""
    jobs = {i for k in set(keys) for i in on.get(k, ())}
    for i in jobs:
        if i in running:
            running[i].speed = math.inf
    for k in set(keys):
        ids = [i for i in on.get(k, ()) if i in running]
        if not ids:
            continue
        s = (1.0,) if len(ids) == 1 else tuple(group_speed([running[i].job for i in ids]))
        for i, v in zip(ids, s):
            running[i].speed = min(running[i].speed, max(float(v), 1e-3))
    for i in jobs:
        if i in running and running[i].speed == math.inf:
            running[i].speed = 1.0


def progress_left(done: int, total: int, it_per_s: float, speed: float = 1.0) -> float | None:
    """A running job's solo work left (seconds at full speed) from its progress: the steps it
    has still to do at the rate it runs now, as solo seconds (``speed``: its speed now
    relative to alone). None when it reports no usable rate or total."""
    if total <= 0 or it_per_s <= 0 or done < 0 or not math.isfinite(it_per_s):
        return None
    return max(0, total - done) / it_per_s * max(speed, 1e-3)


_DEFAULT_POLICY = Policy()


# --------------------------------------------------------------------------- the usual inputs
def planner(inputs: PlanInputs, reasons: bool = False) -> Decide:
    """``decide`` for ``forecast``: plan() with these inputs (the caller's, built once), the
    predictor memoised across the forecast's steps; without waiting reasons by default
    (``reasons=False``, as the simulator plans: the same placements, found faster; the
    forecast reads only the placements; `queue add --test-only` asks for them)."""
    inputs = replace(inputs, reasons=reasons)
    if not isinstance(inputs.model, CachedModel):
        inputs = replace(inputs, model=CachedModel(inputs.model))

    def decide(queue: Sequence[Job], slots: Sequence[GpuSlot], active: Sequence[Job],
               t: float) -> Plan:
        return plan(queue, slots, active, t, inputs)
    return decide


def speeds_of(profiles: Mapping[str, Profile], model: Predictor
              ) -> Callable[[Sequence[Job]], Sequence[float]]:
    """``group_speed`` for ``forecast``: the predictor's speeds for a GPU's jobs (a job without
    a profile: as if alone; it never shares anyway)."""
    cached = model if isinstance(model, CachedModel) else CachedModel(model)

    def speeds(jobs: Sequence[Job]) -> Sequence[float]:
        profs = [profiles.get(j.spec.workload or "") for j in jobs]
        known = [p for p in profs if p is not None]
        if len(known) < 2:
            return (1.0,) * len(jobs)
        got = iter(cached.predict_group(known))
        return tuple(next(got) if p is not None else 1.0 for p in profs)
    return speeds


def runtimes_of(durations: Durations | None) -> Callable[[Job], RuntimeEstimate]:
    """``runtime`` for ``forecast``: ``estimate_runtime`` from the lab's run times, memoised by
    (owner, label, --time)."""
    memo: dict[tuple[object, ...], RuntimeEstimate] = {}

    def runtime(job: Job) -> RuntimeEstimate:
        key = (job.owner, job.spec.workload, job.spec.time_limit_s)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = estimate_runtime(durations, user=job.owner,
                                               workload=job.spec.workload,
                                               time_limit_s=job.spec.time_limit_s)
        return hit
    return runtime


def lefts_of(durations: Durations | None, now: float,
             progress: Mapping[int, float] | None = None) -> Callable[[Job], Left]:
    """``left`` for ``forecast``: a running job's solo work left from its progress
    (``progress``: job id -> solo seconds left, ``progress_left``) where it reports it, else
    its run-time estimate given how long it has run (capped by its --time)."""
    given = progress or {}

    def left(job: Job) -> Left:
        age = max(0.0, now - job.started_at) if job.started_at is not None else 0.0
        est = estimate_runtime(durations, user=job.owner, workload=job.spec.workload,
                               time_limit_s=job.spec.time_limit_s, age_s=age)
        if job.id in given:
            s = given[job.id]
            if job.spec.time_limit_s is not None:
                s = min(s, max(0.0, job.spec.time_limit_s - age))
            return Left(s, s * PROGRESS_LOW, s * PROGRESS_HIGH, "progress")
        return Left(est.left_s(age), max(0.0, est.low_s - age), max(0.0, est.high_s - age),
                    est.source)
    return left


# a job's work left from its progress rate is taken within these factors (its rate varies)
PROGRESS_LOW, PROGRESS_HIGH = 0.9, 1.15

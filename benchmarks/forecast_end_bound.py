"""How well could any forecast of a running job's end do without progress reports?

Runs the simulations ``iadeep sim --forecast`` runs (the same seeds, the same scored running
jobs, so iadeep's figures are the report's) and scores, for each running job whose end was
forecast, two forecasts made in hindsight from every run time of the run (all its seeds
pooled, the job's own left out) of the jobs with the same ``--time`` that ran longer than the
job had when the forecast was made (where fewer than ``MIN_PEERS`` did: the ratio of run time
to ``--time`` of every job, above the job's):

- **hindsight median**: the median of those run times: the run-time distribution known
  exactly instead of learnt from the finished runs so far;
- **hindsight window**: the figure whose +-20% holds the most of those remaining times, the
  best one figure can do for "within 20%" given the job's ``--time`` and age.

``--generator`` instead: the bound from the week's generator itself (``generate_jobs``'s
run times, ``limit_for``'s --time), no simulation: running jobs drawn as a moment in time
finds them (in proportion to their run time, their age uniform within it), no sharing (run
time = solo run time), the exact distribution of run times with the same --time known (a
large draw); ``best_share_within_20pct`` is the mean, over those jobs, of the largest share
of the jobs with their --time and age that one figure puts within 20% of their remaining
time: no forecast from --time and age gets a larger share within 20%
(``hindsight_window``: that figure scored against the job's own remaining time).

And the share of jobs reporting progress the bar takes: per forecast, ``iadeep+progress``'s
error if the job is among a random share ``p`` of the jobs (drawn per seed and job id), else
``iadeep``'s: the median relative error with that share reporting.

Run (one load, or one trace window; prints JSON):
  .venv/bin/python benchmarks/forecast_end_bound.py --load 1.2 --seeds 10
  .venv/bin/python benchmarks/forecast_end_bound.py --generator
  .venv/bin/python benchmarks/forecast_end_bound.py --trace FILE --trace-start 2017-11-10 \\
      --trace-days 7 --trace-every 8 --gpus 16
"""
from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import replace

from iadeep_cli.sim import foresee as fs
from iadeep_cli.sim.engine import PolicyResult, _mem_mib, simulate
from iadeep_cli.sim.policies import make_planner
from iadeep_cli.sim.run import SimSettings, build_trace, load_inputs

MIN_PEERS = 8            # jobs with the same --time above the age, before they alone are used
BAR = fs.BAR_REL         # "within 20%"
SHARES = (0.1, 0.2, 0.3, 0.4, 0.45, 0.5, 0.6)


def _above(values: Sequence[float], x: float) -> Sequence[float]:
    return values[bisect.bisect_right(values, x):]


def _median(values: Sequence[float]) -> float:
    return values[len(values) // 2]


def _window(left: Sequence[float]) -> float:
    """The figure x whose [x / (1 + BAR), x / (1 - BAR)] holds the most of ``left`` (sorted,
    positive): for those, |x - left| <= BAR x left."""
    logs = [math.log(max(1.0, v)) for v in left]
    width = math.log((1 + BAR) / (1 - BAR))
    best, lo, at = 0, 0, logs[0]
    for hi in range(len(logs)):
        while logs[hi] - logs[lo] > width:
            lo += 1
        if hi - lo + 1 > best:
            best, at = hi - lo + 1, logs[lo]
    return math.exp(at) * (1 + BAR)


def _cover(left: Sequence[float]) -> float:
    """The largest share of ``left`` (sorted, positive) one figure puts within BAR."""
    logs = [math.log(max(1.0, v)) for v in left]
    width = math.log((1 + BAR) / (1 - BAR))
    best, lo = 0, 0
    for hi in range(len(logs)):
        while logs[hi] - logs[lo] > width:
            lo += 1
        best = max(best, hi - lo + 1)
    return best / len(logs)


def generator_bound(population: int = 200_000, running: int = 4_000, seed: int = 0
                    ) -> dict[str, object]:
    """The bound from the week's generator: ``population`` jobs drawn as it draws them."""
    from iadeep_cli.sim.engine import generate_jobs
    jobs = generate_jobs(["w"], population, 8, 1.0, seed)
    by_limit: dict[float, list[tuple[float, int]]] = {}
    for j in jobs:
        by_limit.setdefault(fs.limit_for(j, seed), []).append((j.duration_s, j.id))
    for v in by_limit.values():
        v.sort()
    rng = random.Random(f"running:{seed}")
    picks = rng.choices(jobs, weights=[j.duration_s for j in jobs], k=running)
    med_err, win_err, cover = [], [], []
    for j in picks:
        age = rng.uniform(0.0, j.duration_s)
        rem = j.duration_s - age
        # the others with its --time that ran longer (the job itself left out)
        left = [x - age for x, i in by_limit[fs.limit_for(j, seed)] if x > age and i != j.id]
        if not left:
            med_err.append(1.0)
            win_err.append(1.0)
            cover.append(0.0)
            continue
        med_err.append(abs(_median(left) - rem) / rem)
        win_err.append(abs(_window(left) - rem) / rem)
        cover.append(_cover(left))
    return {"generator": True, "population": population, "running_jobs": running,
            "hindsight_median": {"median_rel": statistics.median(med_err),
                                 "within_20pct": sum(e <= BAR for e in med_err) / running},
            "hindsight_window": {"median_rel": statistics.median(win_err),
                                 "within_20pct": sum(e <= BAR for e in win_err) / running},
            "best_share_within_20pct": statistics.mean(cover)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=float, default=1.2)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace")
    ap.add_argument("--trace-start")
    ap.add_argument("--trace-days", type=float)
    ap.add_argument("--trace-every", type=int, default=1)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--by-user", action="store_true",
                    help="hindsight from the same user's jobs with the same --time")
    ap.add_argument("--generator", action="store_true",
                    help="the bound from the week's generator alone (no simulation)")
    a = ap.parse_args()
    settings = SimSettings(load=a.load, policies=("iadeep",), gpus=a.gpus, trace=a.trace,
                           trace_start=a.trace_start, trace_days=a.trace_days,
                           trace_every=a.trace_every)
    profiles, truth, model = load_inputs(settings)
    if a.generator:
        # a trace window's few long jobs have too few peers with their --time for this bound:
        # for a trace, the hindsight in the simulation (without --generator) is the measure
        if a.trace:
            ap.error("--generator is the week's generator alone; for a trace, run without it")
        print(json.dumps(generator_bound(seed=a.seed), indent=1))
        return
    # per forecast: (seed, job id, --time, age, actual remaining, iadeep's and progress's error)
    rows: list[tuple[int, int, tuple[str, float], float, float, float, float]] = []
    # (seed, job id, (user, --time), wall run time); the user is "" unless --by-user
    runs: list[tuple[int, int, tuple[str, float], float]] = []
    for seed in range(a.seed, a.seed + max(1, a.seeds)):
        s = replace(settings, seed=seed)
        jobs = [replace(j, time_limit_s=fs.limit_for(j, seed))
                for j in build_trace(s, profiles, truth)]
        pol = replace(s.policy, fairshare=None)
        mem = {j.id: _mem_mib(j, profiles, pol) for j in jobs}
        planner = make_planner("iadeep", profiles, model, truth, pol, mem, seed)

        def run(scorer: fs.Scorer, _jobs=jobs, _s=s, _pol=pol) -> PolicyResult:
            return simulate(_jobs, scorer, truth, gpus=_s.gpus, gpus_per_node=_s.gpus_per_node,
                            policy=_pol, profiles=profiles, name="iadeep")
        samples, started, ended = fs.run_forecast(jobs, seed, run, planner, profiles, model,
                                                  pol)
        limit = {j.id: (j.user if a.by_user else "", float(j.time_limit_s or 0.0))
                 for j in jobs}
        runs += [(seed, j.id, limit[j.id], ended[j.id] - started[j.id]) for j in jobs]
        for (got, i, ref), (prog, _, _) in zip(samples.ends["iadeep"],
                                               samples.ends["iadeep+progress"]):
            rem = ended[i] - ref
            if got is None or prog is None or rem <= 0:
                continue
            rows.append((seed, i, limit[i], ref - started[i], rem,
                         abs(got - ended[i]) / rem, abs(prog - ended[i]) / rem))
    by_limit: dict[tuple[str, float], list[tuple[float, int, int]]] = {}
    for seed, i, group, ran in runs:
        by_limit.setdefault(group, []).append((ran, seed, i))
    ratios = sorted((ran / group[1], seed, i) for seed, i, group, ran in runs)
    for v in by_limit.values():
        v.sort()
    med_err, win_err = [], []
    for seed, i, key, age, rem, _, _ in rows:
        cap = key[1]
        peers = [r for r, s2, i2 in by_limit[key] if (s2, i2) != (seed, i)]
        above = _above(peers, age)
        if len(above) < MIN_PEERS:
            above = [cap * r for r in _above([r for r, s2, i2 in ratios if (s2, i2) != (seed, i)],
                                            age / cap)]
        if not above:
            med_err.append(1.0)   # nobody ran longer: "ends now", off by all of it
            win_err.append(1.0)
            continue
        left = [x - age for x in above]
        med_err.append(abs(_median(left) - rem) / rem)
        win_err.append(abs(_window(left) - rem) / rem)

    def share(errs: Sequence[float]) -> float:
        return sum(e <= BAR for e in errs) / len(errs)

    out: dict[str, object] = {
        "load": None if a.trace else a.load, "trace": a.trace, "trace_start": a.trace_start,
        "by_user": a.by_user, "seeds": [a.seed, a.seed + max(1, a.seeds) - 1],
        "forecasts": len(rows),
        "iadeep": {"median_rel": statistics.median(r[5] for r in rows),
                   "within_20pct": share([r[5] for r in rows])},
        "iadeep+progress": {"median_rel": statistics.median(r[6] for r in rows),
                            "within_20pct": share([r[6] for r in rows])},
        "hindsight_median": {"median_rel": statistics.median(med_err),
                             "within_20pct": share(med_err)},
        "hindsight_window": {"median_rel": statistics.median(win_err),
                             "within_20pct": share(win_err)},
        "progress_share": {}}
    mixed: dict[str, float] = {}
    for p in SHARES:
        errs = [r[6] if random.Random(f"reports:{r[0]}:{r[1]}").random() < p else r[5]
                for r in rows]
        mixed[f"{p:g}"] = statistics.median(errs)
    out["progress_share"] = mixed
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""Time ``fit_model`` on synthetic labs of growing size against the fit on a lab the size of
shared/data/lucid-part (241 pairs of 25 workloads in 5 families), in the same run.

Synthetic workloads get gpu_util / mem_util spread like real ones and family names
(``famK-vJ``, so the inner cross-validation holds out families as on Lucid's data); a pair's
speeds follow a time-slicing rule with per-pair noise. Cases:

* 241 distinct pairs of 25 workloads (the baseline, lucid-part's size);
* ~1,400 distinct pairs of 56 workloads (all of Lucid's public pairs' size);
* 20,000 observations: repeats of ~1,400 pairs with measurement noise (a busy lab's year);
* the controller's incremental refit: those 20,000 and 10 more, given the previous fit (its
  selected setting is reused; ``fit_parameters(..., previous=...)``).

    .venv/bin/python benchmarks/bench_fit.py [--runs 3]
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def synthetic_lab(n_workloads: int, n_families: int, n_pairs: int, n_obs: int, seed: int = 0):
    """(profiles, observations): ``n_obs`` measurements of ``n_pairs`` distinct pairs."""
    import numpy as np

    from iadeep_cli.profiles import CoLocation, Profile

    rng = np.random.default_rng(seed)
    gpu = "Synthetic GPU"
    profiles = {}
    for i in range(n_workloads):
        name = f"fam{i % n_families}-v{i // n_families}"
        u = float(rng.uniform(5, 100))
        profiles[name] = Profile(workload=name, gpu_model=gpu, gpu_util=u,
                                 mem_util=float(np.clip(u * rng.uniform(0.1, 0.7), 0, 100)),
                                 peak_mem_gib=float(rng.uniform(1, 10)))
    names = sorted(profiles)
    every = list(itertools.combinations_with_replacement(names, 2))
    chosen = [every[i] for i in rng.choice(len(every), min(n_pairs, len(every)), replace=False)]

    def truth(a: str, b: str) -> float:
        us, uo = profiles[a].gpu_util / 100, profiles[b].gpu_util / 100
        return 1.0 / (1.0 + 0.9 * uo * max(0.0, us + uo - 0.8) + 0.1 * uo)

    obs = []
    for k in range(n_obs):
        a, b = chosen[k % len(chosen)]
        sa, sb = truth(a, b) + rng.normal(0, 0.03), truth(b, a) + rng.normal(0, 0.03)
        obs.append(CoLocation(gpu_model=gpu, jobs=(a, b),
                              speeds=(float(np.clip(sa, 0.05, 1.1)), float(np.clip(sb, 0.05, 1.1))),
                              samples=1))
    return profiles, obs


def timed_fit(profiles, obs, runs: int) -> float:
    from iadeep_cli.model.predictor import fit_model

    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fit_model(profiles, obs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed_incremental(profiles, obs, runs: int) -> float:
    """The refit after the last 10 observations, given the fit before them."""
    from iadeep_cli.model.fit import fit_parameters

    previous = fit_parameters(profiles, obs[:-10])
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fit_parameters(profiles, obs, previous=previous)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    cases = [("241 pairs, 25 workloads (baseline)", 25, 5, 241, 241),
             ("1,400 pairs, 56 workloads", 56, 12, 1400, 1400),
             ("20,000 observations of 1,400 pairs", 56, 12, 1400, 20_000)]
    from iadeep_cli.model.data import shipped_pairs, shipped_profiles
    from iadeep_cli.model.predictor import fit_model

    fit_model(shipped_profiles(), shipped_pairs())   # imports scipy once, outside the timings
    base = None
    for label, w, f, p, n in cases:
        profiles, obs = synthetic_lab(w, f, p, n)
        t = timed_fit(profiles, obs, args.runs)
        base = base or t
        print(f"{label:<40} fit {t:7.2f} s (median of {args.runs})  ratio {t / base:5.1f}x",
              flush=True)
    t = timed_incremental(*synthetic_lab(56, 12, 1400, 20_010), args.runs)
    label = "incremental: 20,000 + 10 observations"
    print(f"{label:<40} fit {t:7.2f} s (median of {args.runs})  ratio {t / base:5.1f}x")


if __name__ == "__main__":
    main()

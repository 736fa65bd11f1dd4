"""How the simulator grows with the number of jobs: 1k / 3k / 10k generated jobs under every
default policy (target: near-linear, 10,000 jobs in about a minute on a 2-core machine), and a
real trace's busiest weeks under exclusive and iadeep (target: under 60 s). Philly's busiest
team (6214e9): its busiest 7 days hold 5,704 jobs (no 7-day window of one team in this
extract holds the 8,289 the goal names; docs/simulator.md "Speed"), its busiest 17 days
8,393, the stand-in for that week.

Each size runs every default policy in this process on the same generated trace (8 GPUs,
load 1.2, seed 0, as ``iadeep sim --jobs N``); the time is CPU seconds of this process
(``time.process_time``: what the simulator costs, not what the other tenants of a shared
machine take from it), wall seconds beside it. Growth is reported as the ratio of times between
sizes against the ratio of jobs (linear: 3.0 from 1k to 3k, 3.33 from 3k to 10k); the baseline
is the same run's smaller size, so a slow machine slows both.

Run: .venv/bin/python benchmarks/bench_sim_scale.py [--sizes 1000,3000,10000] [--no-philly]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from iadeep_cli.sim.engine import DEFAULT_POLICIES
from iadeep_cli.sim.run import SimSettings, load_inputs, run_sim

PHILLY = Path("/work/shared/data/traces/philly-2017-sep-nov-dec.csv.gz")
PHILLY_WINDOWS = (
    {"trace_team": "6214e9", "trace_start": "2017-11-09 11:00:50", "trace_days": 7.0,
     "gpus": 32},
    {"trace_team": "6214e9", "trace_start": "2017-11-07", "trace_days": 17.0, "gpus": 32},
)


def timed(s: SimSettings, inputs, policies) -> tuple[dict[str, float], float, int]:
    """CPU seconds per policy, wall seconds in all, jobs simulated."""
    per: dict[str, float] = {}
    wall = time.perf_counter()
    n = 0
    for p in policies:
        t = time.process_time()
        n = run_sim(replace(s, policies=(p,)), inputs=inputs).n_jobs
        per[p] = time.process_time() - t
    return per, time.perf_counter() - wall, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,3000,10000")
    ap.add_argument("--no-philly", action="store_true")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    base = SimSettings()
    inputs = load_inputs(base)
    print(f"iadeep sim --jobs N: {len(DEFAULT_POLICIES)} default policies, 8 GPUs, load 1.2, "
          "seed 0 (CPU seconds of this process)")
    head = f"{'jobs':>6} " + " ".join(f"{p[:9]:>9}" for p in DEFAULT_POLICIES) + \
        f" {'total':>8} {'wall':>8} {'growth':>8} {'linear':>7}"
    print(head)
    print("-" * len(head))
    prev: tuple[int, float] | None = None
    for n in sizes:
        per, wall, _ = timed(replace(base, jobs=n), inputs, DEFAULT_POLICIES)
        total = sum(per.values())
        growth = linear = ""
        if prev is not None:
            growth = f"{total / prev[1]:.2f}x"
            linear = f"{n / prev[0]:.2f}x"
        print(f"{n:>6} " + " ".join(f"{per[p]:>8.1f}s" for p in DEFAULT_POLICIES)
              + f" {total:>7.1f}s {wall:>7.1f}s {growth:>8} {linear:>7}")
        prev = (n, total)
    if args.no_philly or not PHILLY.exists():
        return
    print()
    for window in PHILLY_WINDOWS:
        s = SimSettings(trace=str(PHILLY), **window)   # type: ignore[arg-type]
        per, wall, n = timed(s, inputs, ("exclusive", "iadeep"))
        print(f"Philly, team {window['trace_team']}, {window['trace_days']:g} days from "
              f"{window['trace_start']}, {window['gpus']} GPUs: {n:,} jobs")
        print(f"  exclusive {per['exclusive']:.1f}s  iadeep {per['iadeep']:.1f}s  "
              f"together {sum(per.values()):.1f}s CPU ({wall:.1f}s wall; target < 60 s)")


if __name__ == "__main__":
    main()

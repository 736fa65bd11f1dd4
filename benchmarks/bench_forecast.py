"""What a forecast costs (scheduler/forecast.py): every queued job's expected start and end for
a 1,000-job queue on 64 nodes x 8 GPUs, every GPU busy (target: under 1 s of CPU).

The forecast simulates the queue forward with the same plan() the round calls (the predictor
read cautiously, as the controller reads it), run-time estimates from a lab history of 2,000
finished runs, and the predictor's speeds for jobs that would share. As a same-run baseline it
prints one plan() round over the same queue and GPUs, and the forecast's cost as a multiple of
it (the forecast takes ``steps`` plan() calls over the head of the queue).
Run: .venv/bin/python benchmarks/bench_forecast.py [--queue 1000] [--nodes 64] [--repeat 3]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_profiles
from iadeep_cli.model.predictor import default_model
from iadeep_cli.scheduler import forecast as fc
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, plan, spec_memory_mib
from iadeep_cli.scheduler.prediction import CautiousModel
from iadeep_cli.scheduler.remaining import Durations
from iadeep_cli.settings import Policy

GPUS_PER_NODE = 8
NOW = 10 * 86400.0


def scenario(nodes: int, queued: int, seed: int = 0):
    rng = random.Random(seed)
    profiles = shipped_profiles()
    names = sorted(profiles)
    policy = Policy()
    history = Durations((rng.choice(names), rng.lognormvariate(8.5, 1.3), f"u{k % 7}")
                        for k in range(2000))
    active, slots, jid = [], [], 100_000
    for n in range(nodes):
        for g in range(GPUS_PER_NODE):
            jid += 1
            w = rng.choice(names)
            limit = rng.choice([None, None, 4 * 3600.0, 24 * 3600.0])
            spec = JobSpec("/x.sh", workload=w, time_limit_s=limit)
            active.append(Job(jid, f"u{jid % 7}", spec, JobState.RUNNING, 0.0, node=f"n{n}",
                              gpu_indices=(g,), started_at=NOW - rng.uniform(0, 20000)))
            mem = spec_memory_mib(spec, profiles, policy) or 0.0
            slots.append(GpuSlot(f"n{n}", g, 143771.0, 143771.0 - mem, (jid,), 2))
    queue = []
    for i in range(queued):
        w = rng.choice([*names, None]) if rng.random() < 0.95 else None
        spec = JobSpec("/x.sh", workload=w, gpus=2 if rng.random() < 0.05 else 1,
                       priority=rng.choice([0, 0, 0, 1, 5]),
                       time_limit_s=rng.choice([None, None, 2 * 3600.0, 12 * 3600.0]))
        queue.append(Job(i + 1, f"u{i % 7}", spec, JobState.QUEUED, NOW - rng.uniform(0, 86400)))
    return profiles, policy, history, active, tuple(slots), queue


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queue", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    profiles, policy, history, active, slots, queue = scenario(args.nodes, args.queue)
    model = default_model()

    def one_forecast() -> fc.Forecast:
        cautious = CautiousModel(model)
        return fc.forecast(queue, slots, active, now=NOW,
                           decide=fc.planner(PlanInputs(profiles, cautious, policy,
                                                        durations=history)),
                           left=fc.lefts_of(history, NOW), runtime=fc.runtimes_of(history),
                           group_speed=fc.speeds_of(profiles, cautious),
                           memory=lambda j: spec_memory_mib(j.spec, profiles, policy),
                           order=lambda jobs, t: fc.order_queue(jobs, policy, t, None))

    def one_round() -> None:
        plan(queue, slots, active, NOW,
             PlanInputs(profiles, CautiousModel(model), policy, durations=history))

    def cpu(fn) -> float:
        times = []
        for _ in range(args.repeat):
            t = time.process_time()
            fn()
            times.append(time.process_time() - t)
        return statistics.median(times)

    got = one_forecast()
    placed = sum(1 for j in queue if got.jobs[j.id].start is not None)
    f_cpu = cpu(one_forecast)
    r_cpu = cpu(one_round)
    print(f"forecast: {len(queue)} queued jobs, {len(slots)} GPUs, {len(active)} running")
    print(f"  jobs given a start      {placed} of {len(queue)}  ({got.steps} steps, "
          f"{'cut at the horizon' if got.cut else 'whole queue'})")
    last = max((f.start for f in got.jobs.values() if f.start is not None), default=NOW)
    print(f"  last expected start     {(last - NOW) / 3600:.1f} h from now")
    print(f"  median forecast CPU     {f_cpu * 1000:8.1f} ms   (target < 1000 ms)")
    print(f"  median plan() round CPU {r_cpu * 1000:8.1f} ms   (same run, same input)")
    print(f"  ratio forecast/round    {f_cpu / r_cpu:8.2f}x")


if __name__ == "__main__":
    main()

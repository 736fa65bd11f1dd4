"""Self-tuning's cost: one replay of a lab's last 14 days in the controller's child process.

A database holds 14 days of a 16-GPU lab (two nodes of 8 H200s): 1,000 jobs of the shipped
workloads, log-normal run times (median 1.5 h), 10% two-GPU jobs, as ``iadeep sim`` draws them,
their arrivals spread over 13 days (about 0.7 of what the GPUs serve one job each).
The replay the controller starts (``python -m iadeep_cli.sim.whatif``, nice 10) is timed: its
CPU seconds (it reports them) and wall time, against the same run's baseline: one ``iadeep
sim``-style simulation of the same trace under the settings in force (what one candidate costs).
Run: .venv/bin/python benchmarks/bench_selftune.py [--jobs N]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from iadeep_cli.jobs import JobSpec
from iadeep_cli.model.data import shipped_profiles
from iadeep_cli.settings import Policy
from iadeep_cli.sim.engine import generate_jobs
from iadeep_cli.snapshot import GpuSample, NodeSnapshot
from iadeep_cli.store import Store, cluster, jobrows

DAY_S = 86400.0


def seed(db: Path, n_jobs: int, now: float, nodes: bool = True) -> None:
    """``n_jobs`` finished jobs of the last 14 days (and, with ``nodes``, two 8-GPU nodes'
    snapshots: leave them out for a database a running controller polls into)."""
    drawn = generate_jobs(sorted(shipped_profiles()), n_jobs, 16, 1.2, 0)
    span = drawn[-1].submit_s or 1.0
    scale = 13 * DAY_S / span   # the arrivals spread over 13 of the 14 days
    store = Store(db)
    with store.tx() as conn:
        for j in drawn:
            t = now - 14 * DAY_S + j.submit_s * scale
            job_id, _ = jobrows.insert(conn, f"user{j.id % 5}",
                                       JobSpec(script="/bin/true", workload=j.workload,
                                               gpus=j.gpus), t)
            jobrows.update(conn, job_id, state="succeeded", started_at=t,
                           ended_at=t + j.duration_s)
        if nodes:
            gpus = tuple(GpuSample(index=i, uuid=f"GPU-{i}", name="NVIDIA H200",
                                   memory_total_mib=143771, memory_used_mib=0)
                         for i in range(8))
            cluster.save_nodes(conn, tuple(NodeSnapshot(f"node0{k}", now, gpus, jobs=())
                                           for k in (1, 2)))
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    args = ap.parse_args()
    from iadeep_cli.controller.round.steps.tune import policy_to_json
    from iadeep_cli.sim import whatif

    with tempfile.TemporaryDirectory() as tmp:
        db, out, now = Path(tmp) / "iadeep.db", Path(tmp) / "replay.json", time.time()
        seed(db, args.jobs, now)
        # baseline: one candidate (the settings in force), in this process
        store = Store(db, readonly=True)
        t0 = time.process_time()
        one = whatif.replay(store, Policy(pinned=("max_jobs_per_gpu", "min_speed", "sharing")),
                            14, now)
        one_cpu = time.process_time() - t0
        store.close()
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "iadeep_cli.sim.whatif", "--db", str(db),
                        "--out", str(out), "--days", "14", "--now", repr(now), "--policy",
                        json.dumps(policy_to_json(Policy()))], check=True)
        wall = time.monotonic() - started
        table = json.loads(out.read_text())
    n = len(table["outcomes"])
    print(f"history: {table['trace']} on {table['gpus']} GPUs, 14 days")
    print(f"one candidate (baseline, in-process incl. model fit): {one_cpu:.1f} s CPU "
          f"({len(one['outcomes'])} simulation)")
    print(f"replay child, {n} candidates: {table['cpu_s']:.1f} s CPU, {wall:.1f} s wall "
          f"(nice 10); ratio to one candidate {table['cpu_s'] / one_cpu:.1f}x")
    print(json.dumps({"jobs": table["jobs"], "candidates": n, "cpu_s": table["cpu_s"],
                      "wall_s": round(wall, 2), "one_candidate_cpu_s": round(one_cpu, 2)}))


if __name__ == "__main__":
    main()

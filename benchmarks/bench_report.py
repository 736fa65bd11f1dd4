"""How fast `iadeep report` answers over a busy lab's year: 100,000 finished jobs.

Target (issue 14): under 1 s. The database is a real one (the controller's schema, created by
``Store``), filled with a simulated year: 10 users, 8 workloads, 6 nodes, 1-8 GPUs a job, each
job's events as the controller writes them (queued, starting, running, an end), and one job in
ten requeued once after its node went silent (starting, running, lost, queued, then again).
Rows are written in bulk, so generating takes seconds, not the minutes the controller's
one-transition-at-a-time path would. Each report is a whole `iadeep` process, start-up
included (what a user waits for), against three baselines from the same run: `python -c pass`,
a fresh process that only sums every event's time and every job's end in SQLite (what the
first design had to read), and the same `iadeep report` over an empty database (start-up and
imports: the rest is the report's own work).
Usage: .venv/bin/python benchmarks/bench_report.py [--jobs N] [--repeats N]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PYTHON_PASS, compile_package, python_pass, report, slowest, time_process

YEAR = 365 * 86400


def fill(path: Path, n_jobs: int, end: float, seed: int = 14) -> int:
    """Write ``n_jobs`` finished jobs ending within the year before ``end``; returns the number
    of events written."""
    from iadeep_cli.store import Store

    rng = random.Random(seed)
    store = Store(path)
    users = [f"user{i}" for i in range(10)]
    workloads = [f"wl{i}" for i in range(8)]
    nodes = [f"node{i}" for i in range(6)]
    finals = ["succeeded"] * 80 + ["failed"] * 12 + ["cancelled"] * 6 + ["timeout"] * 2
    jobs, events = [], []
    # ids in submission order, as the controller's AUTOINCREMENT gives them
    submits = sorted(end - YEAR + rng.random() * (YEAR - 3 * 86400) for _ in range(n_jobs))
    for job_id, submitted in enumerate(submits, 1):
        t = submitted
        evs = [(job_id, t, None, "queued")]
        t += rng.expovariate(1 / 600)           # mean wait 10 min
        if rng.random() < 0.1:                  # requeued once: its node went silent
            evs += [(job_id, t, "queued", "starting"), (job_id, t + 5, "starting", "running"),
                    (job_id, t + 1800, "running", "lost"), (job_id, t + 2400, "lost", "queued")]
            t += 2400 + rng.expovariate(1 / 300)
        started = t
        ran = rng.expovariate(1 / 7200)         # mean run 2 h
        evs += [(job_id, t, "queued", "starting"), (job_id, t + 5, "starting", "running")]
        final = rng.choice(finals)
        ended = t + 5 + ran
        evs.append((job_id, ended, "running", final))
        events += evs
        gpus = rng.choice((1, 1, 1, 2, 2, 4, 8))
        predicted = round(rng.uniform(0.5, 1.0), 3) if rng.random() < 0.6 else None
        observed = round(rng.uniform(0.5, 1.0), 3) if predicted and rng.random() < 0.7 else None
        # the accounting the controller keeps on the row (store/impact.py): half the jobs
        # shared their GPUs with one other job at their speed, the rest ran alone
        first = evs[1][1]
        held = (1800.0 if len(evs) > 5 else 0.0) + 5 + ran   # as the events say
        speed = observed or predicted or 1.0
        shared = rng.random() < 0.5
        busy = gpus * ran / (2 if shared else 1)
        work = gpus * ran * (speed if shared else 1.0)
        energy = busy * rng.uniform(300, 700)
        jobs.append((job_id, rng.choice(users), "/train.sh", gpus, rng.choice(workloads), final,
                     submitted, started, ended, rng.choice(nodes),
                     json.dumps(list(range(gpus))), predicted, observed, held, first, work,
                     work if observed else 0.0, busy, gpus * ran if shared else 0.0,
                     work if shared else 0.0, energy))
    with store.tx() as conn:
        conn.executemany(
            "INSERT INTO jobs (id, owner, script, gpus, workload, state, submitted_at, "
            "started_at, ended_at, node, gpu_indices, predicted_speed, observed_speed, "
            "held_s, first_started_at, work_s, measured_s, busy_s, shared_s, shared_work_s, "
            "energy_j) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            jobs)
        conn.executemany("INSERT INTO events (job_id, at, old_state, new_state) "
                         "VALUES (?, ?, ?, ?)", events)
    store.close()
    return len(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    compile_package()
    home = Path(tempfile.mkdtemp(prefix="iadeep-bench-report-"))
    try:
        started = time.perf_counter()
        n_events = fill(home / "iadeep.db", opts.jobs, time.time())
        print(f"generated {opts.jobs} finished jobs, {n_events} events in "
              f"{time.perf_counter() - started:.1f} s "
              f"({(home / 'iadeep.db').stat().st_size / 2**20:.0f} MiB)")
        env = {**os.environ, "IADEEP_HOME": str(home)}
        empty = home / "empty"           # the same command over no jobs: start-up and imports
        empty.mkdir()
        fill(empty / "iadeep.db", 0, time.time())
        iadeep = [sys.executable, "-m", "iadeep_cli", "report", "--since", "400d"]
        scan = ("import sqlite3, sys; c = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', "
                "uri=True); print(c.execute('SELECT SUM(at) FROM events').fetchone(), "
                "c.execute('SELECT SUM(ended_at) FROM jobs').fetchone())")
        rows = [
            python_pass(opts.repeats),
            ("SUM over events and jobs (process)",
             time_process([sys.executable, "-c", scan, str(home / "iadeep.db")],
                           opts.repeats)),
            ("iadeep report, no jobs", time_process(iadeep, opts.repeats,
                                                    env={**env, "IADEEP_HOME": str(empty)})),
            ("iadeep report (a year)", time_process(iadeep, opts.repeats, env=env)),
            ("iadeep report --by user", time_process([*iadeep, "--by", "user"],
                                                     opts.repeats, env=env)),
            ("iadeep report --by day --json", time_process([*iadeep, "--by", "day", "--json"],
                                                           opts.repeats, env=env)),
        ]
    finally:
        shutil.rmtree(home, ignore_errors=True)
    report(rows, PYTHON_PASS)
    slowest(rows[3:], "report", 1.0, f" over {opts.jobs} jobs")


if __name__ == "__main__":
    main()

"""What fair share costs the scheduling round, on a busy lab's year: 100,000 finished jobs.

The controller works out every user's decayed usage once per round (``controller/fairshare.py:
FairShareRound.points``): the first round reads the whole history from the events table, every
later round only the moves since the last one. Measured in process on a real database filled as
``bench_report.py`` fills it (its generator, same seed), against a baseline from the same run:
one SQLite pass that reads every event's time (what recomputing from scratch each round would at
least have to read). Target: a later round well under 10 ms (a round is every 10 s by default).
Usage: .venv/bin/python benchmarks/bench_fairshare.py [--jobs N] [--repeats N]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, report, time_call
from bench_report import fill


def main() -> None:
    from iadeep_cli.controller.fairshare import FairShareRound
    from iadeep_cli.settings import FairShare, Policy
    from iadeep_cli.store import Store

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="iadeep-bench-fairshare-"))
    try:
        now = time.time()
        n_events = fill(home / "iadeep.db", opts.jobs, now)
        print(f"generated {opts.jobs} finished jobs, {n_events} events")
        store = Store(home / "iadeep.db")
        policy = Policy(fairshare=FairShare())

        def scan() -> None:
            with store.tx() as conn:
                conn.execute("SELECT SUM(at) FROM events").fetchone()

        def first_round() -> None:
            FairShareRound().points(store, policy, now)

        steady = FairShareRound()
        steady.points(store, policy, now)
        clock = [now]

        def one_more_move() -> None:   # a job starts between rounds, as in a busy lab
            clock[0] += 10.0
            with store.tx() as conn:
                job = conn.execute("INSERT INTO jobs (owner, script, state, submitted_at) "
                                   "VALUES ('user1', '/t.sh', 'starting', ?)",
                                   (clock[0],)).lastrowid
                conn.execute("INSERT INTO events (job_id, at, old_state, new_state) "
                             "VALUES (?, ?, 'queued', 'starting')", (job, clock[0]))

        later = []
        for _ in range(opts.repeats * 20):
            one_more_move()   # not timed: the controller's own write, not fair share's
            later += time_call(lambda: steady.points(store, policy, clock[0]), 1)
        rows = [("SUM over every event (baseline)", time_call(scan, opts.repeats)),
                ("first round (the whole history)", time_call(first_round, opts.repeats)),
                ("later round (1 move since the last)", later)]
        users = steady.points(store, policy, clock[0]) or {}
        store.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    report(rows, "SUM over every event (baseline)")
    later = median(rows[2][1])
    print(f"{len(users)} users ranked; later round median {later * 1000:.2f} ms "
          f"(target < 10 ms): {'OK' if later < 0.010 else 'MISSED'}")


if __name__ == "__main__":
    main()

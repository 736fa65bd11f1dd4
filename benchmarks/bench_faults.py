"""Fault injection against a real controller and real sshd nodes (loopback only, bounded).

For each scenario in a fixed list, two jobs that allow one retry run, one on each of two nodes;
then node01 gets the fault for ``--fault-s`` seconds while this script samples, every 0.2 s:
- copies at once: the most attempts of one job running at the same time (must be 1);
- healthy node data age: node02's snapshot age in `iadeep status`, in poll intervals (<= 3);
- other clients' latency: a `ping` request's round trip over the controller socket (< 1 s);
then it clears the fault, lets the controller settle, and counts
- jobs lost: accepted jobs that are neither running nor queued/starting again (must be 0).
The "none" row is the same run without a fault: the baseline the others compare with.
"model refit" is no node fault: the controller's refit child runs back to back over
``--refit-obs`` (5,000) observations for the whole window (see ``Refits``). Nor is
"self-tuning": the controller's database gets 14 days of history (1,000 finished jobs) and its
policy ``tune_every: 1``, so its own replay child (nice 10) runs back to back; the share of the
window's samples that found one running is printed. Nor is "forecasting": the controller's
queue gets ``--queue`` (1,000) waiting jobs behind the two running ones (every GPU busy, as in
bench_forecast.py) and one more every 2 s of the window, so its forecast thread
(controller/foresight.py) forecasts the whole queue as often as it ever does (every
``MIN_GAP_S``, 5 s); the forecasts made during the window (a waiting job's ``made_at``, read
with `queue show`) are printed.
Usage: .venv/bin/python benchmarks/bench_faults.py [--fault-s 15] [--poll 1] [--grace 5]
       [--scenarios none,"model refit"] [--refit-obs 5000] [--queue 1000]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from helpers.controllers import ControllerProcess, attempt_processes, cli, jobs_by_id, kill_attempt  # noqa: E402
from helpers.sshd import Cluster  # noqa: E402

SCENARIOS = ("none", "nvidia-smi failing", "nvidia-smi hanging", "sshd SIGSTOP",
             "network gone", "node rebooted", "model refit", "self-tuning", "forecasting")


class Queue:
    """The "forecasting" scenario: waiting jobs written into the running controller's
    database (as `queue add` would leave them, the script aside: none is ever placed while the
    two exclusive jobs hold both GPUs), ``n`` at once and then one at a time (``more``)."""

    def __init__(self, db: Path, n: int):
        import getpass

        from iadeep_cli.model.data import shipped_profiles
        from iadeep_cli.store import Store

        self.labels = sorted(shipped_profiles())
        self.owner = getpass.getuser()
        self.store = Store(db)
        self.ids: list[int] = []
        self.more(n)

    def more(self, n: int = 1) -> None:
        from iadeep_cli.jobs import JobSpec
        from iadeep_cli.store import jobrows

        with self.store.tx() as conn:
            for _ in range(n):
                spec = JobSpec(script="/bin/true",
                               workload=self.labels[len(self.ids) % len(self.labels)])
                self.ids.append(jobrows.insert(conn, self.owner, spec, time.time())[0])

    def made_at(self, home: Path) -> float | None:
        """When the forecast a `queue show` of the first waiting job reads was made."""
        got = json.loads(cli(home, "queue", "show", str(self.ids[0]), "--json",
                             check=True).stdout).get("forecast")
        return None if not got else got.get("made_at")

    def close(self) -> None:
        self.store.close()


class Refits:
    """The "model refit" scenario: the controller's database gets ``n_obs`` co-location
    measurements (bench_fit's synthetic lab: 56 workloads, 1,400 pairs), and the controller's
    own refit command (controller/round/refit.py: a child process at nice 10) runs back to back for
    the whole fault window, as the controller starts it when observations change."""

    def __init__(self, db: Path, out: Path, n_obs: int):
        import threading

        sys.path.insert(0, str(HERE))
        from bench_fit import synthetic_lab
        from iadeep_cli.store import Store, profiles as profrows

        profiles, obs = synthetic_lab(56, 12, 1400, n_obs)
        store = Store(db)
        try:
            with store.tx() as conn:
                for p in profiles.values():
                    profrows.upsert_profile(conn, p, 0.0)
                for o in obs:
                    profrows.add_colocation(conn, o, 0.0)
        finally:
            store.close()
        self.db, self.out = db, out
        self.stop = threading.Event()
        self.times: list[float] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        from iadeep_cli.controller.round import refit

        while not self.stop.is_set():
            # each refit a full one (the selection too): the worst case, not the incremental
            self.out.unlink(missing_ok=True)
            t0 = time.perf_counter()
            done = refit.run(self.db, self.out)
            if done.returncode != 0:
                raise SystemExit(f"refit failed: {done.stderr}")
            self.times.append(time.perf_counter() - t0)


def inject(cluster, name: str, jobs: dict[int, str]) -> None:
    node = cluster.node("node01")
    if name == "nvidia-smi failing":
        node.set_fake(mode="driverfail")
    elif name == "nvidia-smi hanging":
        node.set_fake(sleep=600)
    elif name == "sshd SIGSTOP":
        node.pause()
    elif name in ("network gone", "node rebooted"):
        node.stop()


def clear(cluster, name: str, jobs: dict[int, str], home: Path) -> None:
    node = cluster.node("node01")
    if name == "node rebooted":
        for job, where in jobs.items():
            if where == "node01":
                kill_attempt(job, "node01", home)
    node.resume()
    node.set_fake(gpus=1)
    node.start()


def _these(home: Path, ids: list[int]) -> dict[int, dict]:
    """Jobs ``ids`` as `iadeep queue show` has them (`queue list --all` shows only the newest:
    the self-tuning scenario adds 1,000 finished jobs after them)."""
    return {i: json.loads(cli(home, "queue", "show", str(i), "--json", check=True).stdout)
            for i in ids}


def _replay_running() -> bool:
    """Whether a self-tuning replay child (``iadeep_cli.sim.whatif``) runs now."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"iadeep_cli.sim.whatif" in (proc / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def most_copies(cluster, ids: list[int], home: Path) -> int:
    """The most attempts of one of ``ids`` running at once right now, over all nodes."""
    return max(sum(1 for n in cluster.nodes if attempt_processes(i, n, home)) for i in ids)


def run(cluster, tmp: Path, name: str, args) -> dict:
    from iadeep_cli.controller import client

    cluster.reset()
    for n in cluster.nodes.values():
        n.set_fake(gpus=1)
    state = tmp / name.replace(" ", "-")
    inv = tmp / f"{state.name}.yaml"
    tune = "  policy:\n    tune_every: 1\n" if name == "self-tuning" else ""
    inv.write_text(f"lab:\n  poll_interval: {args.poll}\n  node_grace: {args.grace}\n{tune}"
                   + cluster.inventory_yaml())
    ctl = ControllerProcess(state, inv).start()
    script = tmp / "long.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    try:
        ids = [int(cli(state, "queue", "add", str(script), "--exclusive", "--retries", "1",
                       check=True).stdout) for _ in range(2)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = jobs_by_id(state)
            if all(jobs[i]["state"] == "running" for i in ids):
                break
            time.sleep(0.2)
        where = {i: jobs[i]["node"] for i in ids}
        refits = None
        if name == "model refit":
            refits = Refits(next(state.rglob("iadeep.db")), tmp / "refit-model.json",
                            args.refit_obs)
            refits.thread.start()
        elif name == "self-tuning":
            sys.path.insert(0, str(HERE))
            from bench_selftune import seed
            seed(next(state.rglob("iadeep.db")), 1000, time.time(), nodes=False)
        elif name == "forecasting":
            queue = Queue(next(state.rglob("iadeep.db")), args.queue)
            made: set[float] = set()
            next_add = time.monotonic() + 2.0
        else:
            inject(cluster, name, where)
        replaying = []
        copies, ages, latency = 1, [], []
        sock = state / "controller.sock"
        end = time.monotonic() + args.fault_s
        while time.monotonic() < end:
            copies = max(copies, most_copies(cluster, ids, state))
            t0 = time.perf_counter()
            client.call("ping", socket_path=sock, timeout=10)
            latency.append(time.perf_counter() - t0)
            status = client.call("status", socket_path=sock, timeout=10)
            healthy = {n["name"]: n for n in status["nodes"]}["node02"]
            ages.append((status["now"] - healthy["taken_at"]) / args.poll)
            replaying.append(_replay_running())
            if name == "forecasting" and time.monotonic() >= next_add:
                queue.more()
                made.add(queue.made_at(state) or 0.0)
                next_add = time.monotonic() + 2.0
            time.sleep(0.2)
        if refits is not None:
            refits.stop.set()
            refits.thread.join()
            print(f"model refit: {len(refits.times)} refits over {args.refit_obs} "
                  f"observations, {statistics.median(refits.times):.1f} s each (median)",
                  file=sys.stderr)
        elif name == "self-tuning":
            print(f"self-tuning: a replay ran during {sum(replaying)} of {len(replaying)} "
                  "samples", file=sys.stderr)
        elif name == "forecasting":
            made.add(queue.made_at(state) or 0.0)
            made.discard(0.0)
            print(f"forecasting: {len(queue.ids)} jobs waiting at the end; {len(made)} "
                  f"forecasts seen made during the {args.fault_s:g} s window", file=sys.stderr)
            queue.close()
        else:
            clear(cluster, name, where, state)
        deadline = time.monotonic() + 60
        lost = len(ids)
        while time.monotonic() < deadline and lost:
            jobs = _these(state, ids)
            lost = sum(1 for i in ids if jobs[i]["state"] not in ("running", "starting",
                                                                  "queued"))
            copies = max(copies, most_copies(cluster, ids, state))
            time.sleep(0.3)
        return {"scenario": name, "copies_at_once": copies,
                "healthy_age_intervals": max(ages), "client_latency_s": max(latency),
                "jobs_lost": lost}
    finally:
        ctl.stop()
        cluster.kill_jobs()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault-s", type=float, default=15.0)
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--grace", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--refit-obs", type=int, default=5000,
                    help="co-location measurements the 'model refit' scenario refits over")
    ap.add_argument("--queue", type=int, default=1000,
                    help="waiting jobs the 'forecasting' scenario queues up front")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="comma-separated subset of: " + ", ".join(SCENARIOS))
    args = ap.parse_args()
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {', '.join(unknown)}; known: "
                         + ", ".join(SCENARIOS))
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp) / "nodes", 2)
        os.environ["HOME"] = str(cluster.home)
        try:
            rows = [run(cluster, Path(tmp), name, args) for name in chosen]
        finally:
            cluster.shutdown()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'scenario':<20} {'copies at once':>14} {'healthy data age':>17} "
          f"{'client latency':>15} {'jobs lost':>9}")
    for r in rows:
        print(f"{r['scenario']:<20} {r['copies_at_once']:>14} "
              f"{r['healthy_age_intervals']:>10.1f} polls {r['client_latency_s']:>13.3f}s "
              f"{r['jobs_lost']:>9}")
    ok = all(r["copies_at_once"] == 1 and r["healthy_age_intervals"] <= 3 and
             r["client_latency_s"] < 1 and r["jobs_lost"] == 0 for r in rows)
    print(f"targets (1 / <= 3 poll intervals / < 1 s / 0): {'met' if ok else 'NOT met'}; "
          f"poll interval {args.poll:g} s, grace {args.grace:g} s, fault {args.fault_s:g} s")


if __name__ == "__main__":
    main()

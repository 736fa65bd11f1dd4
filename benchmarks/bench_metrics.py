"""What serving Prometheus metrics costs the scheduling loop: a round's time with metrics off,
on (served, not scraped), on while scraped every second (Prometheus' default is every 15 s),
and on while scraped back to back (a stress case: the scraper's own CPU competes too), measured
in the same run on the same state, in interleaved blocks so that a noisy machine affects them
alike. Target: on and scraped every second within a few percent of off.

Real parts: N sshd nodes (127.0.0.x) with the stand-in nvidia-smi replaying the loaded H200, a
real ``runtime.Controller`` whose rounds (``_tick``: poll every node over SSH, record,
reconcile, decide) are timed here, real jobs running on every GPU, a database with a history of
finished jobs, and a scraper in its own process (as Prometheus is) using urllib.
Usage: .venv/bin/python benchmarks/bench_metrics.py [--nodes 8] [--gpus 2] [--history 10000]
       [--blocks 5] [--rounds 6]
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers.sshd import Cluster

SCRAPER = r"""
import sys, time, urllib.request
url, every = sys.argv[1], float(sys.argv[2])
while True:
    began = time.perf_counter()
    lines = urllib.request.urlopen(url, timeout=60).read().count(b"\n")
    print(f"{time.perf_counter() - began:.6f} {lines}", flush=True)
    time.sleep(max(0.0, every - (time.perf_counter() - began)))
"""
JOB = b"#!/bin/sh\nexec sleep 3600\n"
# mode -> (what it is, seconds between scrapes: None no scraper, 0 back to back)
MODES = {"off": ("metrics off (baseline)", None), "on": ("metrics on, not scraped", None),
         "every_1s": ("metrics on, scraped every 1 s", 1.0),
         "max": ("metrics on, scraped back to back", 0.0)}


def _history(store, count: int) -> None:
    """``count`` finished jobs, as a lab accumulates them (the per-state counts scan them)."""
    from iadeep_cli.jobs import JobSpec, JobState as S
    from iadeep_cli.store import jobrows

    now = time.time() - 86400
    ends = (S.SUCCEEDED, S.SUCCEEDED, S.SUCCEEDED, S.FAILED, S.CANCELLED)
    with store.tx() as conn:
        for i in range(count):
            job, _ = jobrows.insert(conn, f"u{i % 7}", JobSpec(f"/h/{i}.sh"), now + i)
            jobrows.transition(conn, job, S.STARTING, "placed", "bench", now + i + 5,
                               node="node01", gpu_indices=(0,))
            jobrows.transition(conn, job, S.RUNNING, "running", "bench", now + i + 6)
            jobrows.transition(conn, job, ends[i % len(ends)], "ended", "bench", now + i + 60)


def _fill(ctl, jobs: int) -> None:
    """One sleeping job per GPU, through the service as `queue add` would, then rounds until
    they all run."""
    from iadeep_cli import messages as m
    from iadeep_cli.jobs import JobSpec, JobState, SubmitSpec

    for i in range(jobs):
        spec = SubmitSpec.from_dict(json.loads(json.dumps(SubmitSpec.of(JobSpec(   # as it travels
            "/bench/sleep.sh", name=f"sleep{i}", workload="resnet50", exclusive=True),
            retries=0, notify="none").to_dict())))
        ctl.service.op_add("root", m.AddRequest(spec, token=f"t{i}",
                                                script_b64=base64.b64encode(JOB).decode()))
    for _ in range(200):
        ctl._tick()
        ctl.loop.actions.drain()
        counts = ctl.service.status().queue
        if counts[JobState.RUNNING] == jobs:
            return
    raise SystemExit(f"jobs did not all start: {counts}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--history", type=int, default=10_000)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), args.nodes)
        try:
            for node in cluster.nodes.values():
                node.set_fake(mode="loaded", gpus=args.gpus)
            os.environ["HOME"] = str(cluster.home)
            os.environ["IADEEP_HOME"] = str(cluster.home / "state")
            run(cluster, Path(tmp) / "state", args)
        finally:
            cluster.shutdown()


def run(cluster, state: Path, args) -> None:
    from iadeep_cli.controller.requests.metrics import serve
    from iadeep_cli.controller.runtime import Controller

    ctl = Controller(cluster.inventory, state)
    _history(ctl.store, args.history)
    _fill(ctl, args.nodes * args.gpus)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    scrapes: dict[str, list[tuple[float, int]]] = {mode: [] for mode in MODES}
    collects: list[float] = []
    try:
        for _ in range(args.blocks):
            for mode in times:
                server = None
                scraper = None
                if mode != "off":
                    server = serve(("127.0.0.1", 0), ctl.store.path, lambda: ctl.inventory,
                                   lambda: False, ctl.started_at)
                    ctl.metrics = server
                    began = time.perf_counter()
                    list(server.collector.collect())
                    collects.append(time.perf_counter() - began)
                if MODES[mode][1] is not None:
                    assert server is not None
                    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, server.url,
                                                str(MODES[mode][1])],
                                               stdout=subprocess.PIPE, text=True)
                    assert scraper.stdout is not None
                    if not scraper.stdout.readline():   # its first scrape is done
                        raise SystemExit("the scraper failed")
                for _ in range(args.rounds):
                    began = time.perf_counter()
                    ctl._tick()
                    took = time.perf_counter() - began
                    times[mode].append(took)
                    if server is not None:
                        server.round_done(took, time.time())
                if scraper is not None:
                    scraper.terminate()
                    out, _ = scraper.communicate()
                    scrapes[mode] += [(float(t), int(n)) for t, n in
                                      (line.split() for line in out.splitlines() if line)]
                if server is not None:
                    server.close()
                    ctl.metrics = None
    finally:
        if ctl.loop is not None:
            ctl.loop.close()
        ctl.socket.close()
        ctl.store.close()
    off = statistics.median(times["off"])
    print(f"nodes={args.nodes} x {args.gpus} GPUs, {args.nodes * args.gpus} running jobs, "
          f"{args.history} finished jobs; {args.blocks} blocks x {args.rounds} rounds per mode "
          f"(interleaved); cpus={os.cpu_count()}")
    for mode, (label, _) in MODES.items():
        xs = times[mode]
        print(f"  round, {label:<36} median {statistics.median(xs) * 1000:7.1f} ms "
              f"(min {min(xs) * 1000:6.1f}, max {max(xs) * 1000:6.1f})  "
              f"ratio vs off {statistics.median(xs) / off:5.2f}x")
        if scrapes[mode]:
            lat = [t for t, _ in scrapes[mode]]
            print(f"      {len(lat)} scrapes ({len(lat) / sum(xs):.1f}/s), latency median "
                  f"{statistics.median(lat) * 1000:.1f} ms, {scrapes[mode][-1][1]} lines each")
    print(f"  one collect in process (no HTTP): median {statistics.median(collects) * 1000:.1f} ms")
    large_lab(state.parent / "large")


def large_lab(where: Path, repeats: int = 7) -> None:
    """What one scrape costs a big lab: the monitor benchmark's 64 x 8 GPUs, 1,024 running and
    2,000 queued jobs (tests/helpers/seed.py "large"), rendered as Prometheus text in process;
    beside it, the same state read by `status --json`'s handler (the same read, no series)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from helpers import seed
    from iadeep_cli.controller.requests import views
    from iadeep_cli.controller.requests.metrics import LabCollector
    from iadeep_cli.settings import Inventory, Node
    from iadeep_cli.store import Store

    where.mkdir()
    store = Store(where / "iadeep.db")
    seed.seed(store, "large")
    inventory = Inventory(nodes=tuple(Node(f"node{n:02d}", "h") for n in range(64)))
    collector = LabCollector(store.path, lambda: inventory, lambda: False, seed.NOW,
                             clock=lambda: seed.NOW)
    registry = CollectorRegistry()
    registry.register(collector)
    lines = generate_latest(registry).count(b"\n")
    scrape = statistics.median(_times(lambda: generate_latest(registry), repeats))
    reader = views.StoreReader(store, clock=lambda: seed.NOW, inventory=inventory)
    status = statistics.median(_times(lambda: reader.status().to_dict(), repeats))
    collector.close()
    store.close()
    print(f"  a 64 x 8 GPU lab, 1,024 running + 2,000 queued jobs: one scrape ({lines} lines) "
          f"{scrape * 1000:.1f} ms in process; status --json's read of the same state "
          f"{status * 1000:.1f} ms ({scrape / status:.2f}x)")


def _times(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        out.append(time.perf_counter() - began)
    return out


if __name__ == "__main__":
    main()

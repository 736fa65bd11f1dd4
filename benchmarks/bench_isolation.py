"""One member cannot slow or stop the lab: a real controller (systemd's 1,024 open files, one
real sshd node, a 1 s poll) under each attack in turn, and another member's experience meanwhile.

Attacks (each by other OS accounts or peers, held while this script measures):
- none: the baseline row, the same run without an attack;
- socket flood: 4 accounts x 40 idle connections, reopened as they are dropped;
- stalled uploads: 2 accounts x 4 submissions that stop after 1 MiB, reopened as dropped;
- metrics flood: 1,000 idle TCP connections to the metrics port from one address;
- history reads: one account's 2 clients looping `queue list --all --limit 10000` (the longest
  page) over 13,000 finished jobs.
Measured for the other member (root here, an account the attackers are not):
- status: round trip of `status` over the socket, median and max of 10 (target < 1 s);
- start: a one-second job's wait from submission to `running`, in poll intervals (target <= 2).
Usage (root: it creates accounts): .venv/bin/python benchmarks/bench_isolation.py [--poll 1]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from helpers.accounts import AsUser  # noqa: E402
from helpers.controllers import ControllerProcess  # noqa: E402
from helpers.floods import hold_idle, read_history, stall_uploads  # noqa: E402
from helpers.sshd import Cluster  # noqa: E402

SCENARIOS = ("none", "socket flood", "stalled uploads", "metrics flood", "history reads")
HISTORY = 13_000


def _nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def _seed_history(db: Path, n: int) -> None:
    """``n`` finished jobs, as a long-lived lab has (written beside the running controller:
    WAL, one transaction)."""
    from iadeep_cli.jobs import JobSpec, JobState
    from iadeep_cli.store import Store, jobrows

    store = Store(db)
    try:
        with store.tx() as conn:
            for i in range(n):
                job, _ = jobrows.insert(conn, "old", JobSpec("/h.sh", name=f"hist{i}",
                                                             args=("x" * 200,)), float(i))
                jobrows.transition(conn, job, JobState.CANCELLED, "history", "old", float(i))
    finally:
        store.close()


class Attack:
    """Start ``name`` against ``ctl``; stop() ends it."""

    def __init__(self, name: str, ctl: ControllerProcess, metrics_port: int):
        self.name, self.floods, self.threads = name, [], []
        self.stop_r, self.stop_w = os.pipe()
        self.stopping = threading.Event()
        self.sockets: list[socket.socket] = []
        path = str(ctl.home / "controller.sock")
        if name == "socket flood":
            self._as_users(4, hold_idle, path, 40)
        elif name == "stalled uploads":
            self._as_users(2, stall_uploads, path, 4)
        elif name == "metrics flood":
            for _ in range(1000):
                s = socket.socket()
                s.bind(("127.0.0.3", 0))
                s.settimeout(30)
                try:
                    s.connect(("127.0.0.1", metrics_port))
                except OSError:
                    pass
                self.sockets.append(s)
        elif name == "history reads":
            self._as_users(1, read_history, path, 2)

    def _as_users(self, n: int, fn, *args) -> None:
        readies = []
        for i in range(n):
            ready_r, ready_w = os.pipe()
            self.floods.append(AsUser(f"iadeep-flood{i}", fn, *args, ready_w, self.stop_r))
            os.close(ready_w)
            readies.append(ready_r)
        for r in readies:
            assert os.read(r, 1) == b"r", f"{self.name}: an attacking process failed"

    def stop(self) -> None:
        self.stopping.set()
        os.write(self.stop_w, b"s" * len(self.floods))
        for f in self.floods:
            f.result()
        for t in self.threads:
            t.join(120)
        for s in self.sockets:
            s.close()


def measure(ctl: ControllerProcess, script: Path, poll: float) -> dict:
    from iadeep_cli.controller import client

    path = ctl.home / "controller.sock"
    took = []
    for _ in range(10):
        t0 = time.perf_counter()
        client.call("status", socket_path=path, timeout=60)
        took.append(time.perf_counter() - t0)
        time.sleep(0.1)
    os.environ["IADEEP_HOME"] = str(ctl.home)
    job = client.submit({"script": str(script)}, script.read_bytes()).id
    deadline = time.monotonic() + 120
    start_s = float("nan")
    while time.monotonic() < deadline:
        detail = client.call("show", {"id": job}, socket_path=path, timeout=60)
        events = detail["events"]
        running = [e["at"] for e in events if e["new_state"] == "running"]
        if running:
            start_s = running[0] - events[0]["at"]
            break
        time.sleep(0.1)
    return {"status_median_s": statistics.median(took), "status_max_s": max(took),
            "start_polls": start_s / poll}


def _quick_check_s(db: Path) -> float:
    """What the controller's damage check (every 10 polls) costs on this database."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        t0 = time.perf_counter()
        assert conn.execute("PRAGMA quick_check(1)").fetchone()[0] == "ok"
        return time.perf_counter() - t0
    finally:
        conn.close()


def _preload() -> None:
    """What the attacking processes (forked, then another account) use, loaded here first:
    other accounts cannot read the interpreter's files under /root."""
    from iadeep_cli import messages  # noqa: F401
    from iadeep_cli.controller import client, protocol  # noqa: F401


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    _preload()
    rows = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp_s:
        tmp = Path(tmp_s)
        os.chmod(tmp, 0o755)   # the attacking accounts reach the socket
        cluster = Cluster(tmp / "nodes", 1)
        os.environ["HOME"] = str(cluster.home)
        script = tmp / "quick.sh"
        script.write_text("#!/bin/sh\nsleep 1\n")
        try:
            for name in SCENARIOS:
                state = tmp / name.replace(" ", "-")
                inv = tmp / f"{state.name}.yaml"
                inv.write_text(f"lab:\n  poll_interval: {args.poll}\n  node_grace: 30\n"
                               + cluster.inventory_yaml())
                ctl = ControllerProcess(state, inv, "--metrics", "127.0.0.1:0",
                                        preexec_fn=_nofile).start()
                extra = {}
                try:
                    if name == "history reads":
                        _seed_history(state / "iadeep.db", HISTORY)
                        extra["quick_check_s"] = _quick_check_s(state / "iadeep.db")
                    log = ctl.log.read_text()
                    port = int(log.split("serving Prometheus metrics on http://")[1]
                               .split(":")[1].split("/")[0])
                    attack = Attack(name, ctl, port)
                    try:
                        rows.append({"attack": name, **measure(ctl, script, args.poll),
                                     "alive": ctl.proc.poll() is None, **extra})
                    finally:
                        attack.stop()
                finally:
                    ctl.stop()
                    cluster.kill_jobs()
        finally:
            cluster.shutdown()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    base = rows[0]
    print(f"{'attack':<18} {'status median':>13} {'max':>8} {'vs none':>8} "
          f"{'job start':>12} {'alive':>6}")
    for r in rows:
        print(f"{r['attack']:<18} {r['status_median_s'] * 1000:>11.0f}ms "
              f"{r['status_max_s'] * 1000:>6.0f}ms "
              f"{r['status_median_s'] / base['status_median_s']:>7.1f}x "
              f"{r['start_polls']:>6.1f} polls {r['alive']!s:>6}")
    for r in rows:
        if "quick_check_s" in r:
            print(f"damage check (PRAGMA quick_check) of the {HISTORY:,}-job database: "
                  f"{r['quick_check_s'] * 1000:.0f} ms")
    ok = all(r["status_max_s"] < 1 and r["start_polls"] <= 2 and r["alive"] for r in rows)
    print(f"targets (status < 1 s, start <= 2 poll intervals, controller alive): "
          f"{'met' if ok else 'NOT met'}; poll interval {args.poll:g} s")


if __name__ == "__main__":
    main()

"""The Prometheus endpoint end to end: real sshd nodes replaying real nvidia-smi output, a real
controller process started with --metrics (or lab.metrics), scraped with urllib and read with
prometheus_client's own parser; the values are checked against the fixture files, `status
--json` and `queue show --json`. Also: a bad or busy address is a one-line error, and a scrape
never waits for the writer (it reads through its own connection)."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.controllers import ControllerProcess, cli, queue_add, start_lab, wait_until

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/nvidia-smi"
MIB = 1024 * 1024
TRAIN = """#!/usr/bin/env python3
import os, time
for step in range(1, 100000):
    time.sleep(0.1)
    with open(os.environ["IADEEP_PROGRESS_FILE"], "a") as f:
        f.write(f"{time.time():.3f} {step}\\n")
"""
GPU_MODE = {"node01": ("loaded", 1), "node02": ("idle", 2)}   # node -> (stand-in mode, GPUs)


def _fixture_gpu(mode: str) -> dict[str, float]:
    """The GPU readings nvidia-smi gave on the H200 in ``mode`` (the stand-in replays them)."""
    row = (FIXTURES / f"h200-{mode}-query-gpu-full.csv-noheader-nounits.txt").read_text()
    cols = [c.strip() for c in row.split(",")]
    # the query's order: index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,
    # memory.free,utilization.gpu,utilization.memory,temperature.gpu,power.draw,power.limit,...
    return {"iadeep_gpu_memory_total_bytes": float(cols[5]) * MIB,
            "iadeep_gpu_memory_used_bytes": float(cols[6]) * MIB,
            "iadeep_gpu_utilization_ratio": float(cols[8]) / 100,
            "iadeep_gpu_temperature_celsius": float(cols[10]),
            "iadeep_gpu_power_draw_watts": float(cols[11]),
            "iadeep_gpu_power_limit_watts": float(cols[12])}


def _inventory(cluster, tmp_path, metrics: str = "") -> Path:
    for name, (mode, gpus) in GPU_MODE.items():
        cluster.nodes[name].set_fake(mode=mode, gpus=gpus)
    path = tmp_path / "nodes.yaml"
    path.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 3\n" + metrics
                    + cluster.inventory_yaml())
    return path


def _metrics_url(ctl: ControllerProcess) -> str:
    """The address the controller logged (port 0: the one it was given)."""
    found = re.search(r"serving Prometheus metrics on (http://\S+)", ctl.log.read_text())
    assert found, ctl.log.read_text()
    return found.group(1)


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of one scrape: (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=60) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def promtool_problems(url: str) -> str:
    """What Prometheus's own linter (`promtool check metrics`, Debian's prometheus package,
    which `make test` installs) says of one scrape: '' when it passes."""
    with urllib.request.urlopen(url, timeout=60) as reply:
        text = reply.read()
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          timeout=60)
    return (done.stdout + done.stderr).decode().strip() if done.returncode else ""


def series(samples, metric: str, /, **labels: str) -> float | None:
    return samples.get((metric, frozenset(labels.items())))


def names(samples) -> set[str]:
    return {name for name, _ in samples}


def _status(home) -> dict:
    return json.loads(cli(home, "status", "--json", check=True).stdout)


def _consistent(home, url, project, ok=lambda _: True):
    """A scrape between two `status --json` that agree on ``project(status)`` (and that
    projection ``ok``), so the scrape saw the same state; returns (samples, the projection).
    On a busy machine a poll can outlast its round, and a node then shows down for a moment."""
    for _ in range(100):
        before = project(_status(home))
        samples = scrape(url)
        if ok(before) and project(_status(home)) == before:
            return samples, before
    raise AssertionError("the state kept changing between status and scrape")


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    ctl = ControllerProcess(tmp_path / "state", _inventory(cluster, tmp_path),
                            "--metrics", "127.0.0.1:0")
    ctl.cluster = cluster
    ctl.start()
    yield ctl
    ctl.stop()


def test_metrics_carry_the_labs_state(lab, tmp_path):
    home, url = lab.home, _metrics_url(lab)
    train = tmp_path / "train.py"   # one process that reports progress (a shell script's
    train.write_text(TRAIN)         # `sleep` children would come and go as GPU processes)
    long = queue_add(home, str(train), "--workload", "resnet50", "--name", "train")
    waiting = queue_add(home, str(ROOT / "jobs/hello.sh"), "--after", str(long), "--name", "next")
    bad = tmp_path / "fails.sh"
    bad.write_text("#!/bin/sh\nexit 3\n")
    failing = queue_add(home, str(bad), "--name", "broken")
    cli(home, "queue", "hold", str(waiting), check=True)

    def settled(status):
        q = status["queue"]
        return q["running"] == 1 and q["held"] == 1 and q["failed"] == 1
    wait_until(lambda: settled(_status(home)), limit=90)

    # jobs by state: the counts of `status --json`, every state present
    samples, queue = _consistent(home, url, lambda s: s["queue"])
    assert {s: series(samples, "iadeep_jobs", state=s) for s in queue} == \
        {s: float(n) for s, n in queue.items()}
    assert set(queue) == {"queued", "held", "starting", "running", "suspended", "succeeded",
                          "failed", "cancelled", "timeout", "lost"}

    # the impact factor since the start, as status shows it (its parts grow between two reads,
    # the ratio of a job running alone does not), and its parts are there
    def factor(s):
        window = s["impact_since_start"] or {}
        return round(window.get("impact_factor") or 0.0, 3)
    samples, shown_factor = _consistent(home, url, factor, lambda f: f > 0)
    assert series(samples, "iadeep_impact_factor", window="start") == \
        pytest.approx(shown_factor, abs=0.002)
    assert series(samples, "iadeep_work_gpu_seconds", window="start") > 0
    assert series(samples, "iadeep_busy_gpu_seconds", window="1h") > 0
    assert not {n for n in names(samples) if n.endswith("_hours")}   # base units only
    assert promtool_problems(url) == ""

    # every GPU: what the replayed nvidia-smi said, exactly, and what status says runs there
    def nodes(s):
        return [{k: n[k] for k in ("name", "state", "gpus", "down_since")} for n in s["nodes"]]
    samples, shown = _consistent(home, url, nodes,
                                 lambda ns: all(n["state"] == "up" for n in ns))
    for node in shown:
        mode, count = GPU_MODE[node["name"]]
        assert node["state"] == "up" and len(node["gpus"]) == count
        assert series(samples, "iadeep_node_up", node=node["name"]) == 1.0
        assert series(samples, "iadeep_node_reachable", node=node["name"]) == 1.0
        assert series(samples, "iadeep_node_state", node=node["name"], state="up") == 1.0
        assert series(samples, "iadeep_node_state", node=node["name"], state="down") == 0.0
        for gpu in node["gpus"]:
            key = {"node": node["name"], "gpu": str(gpu["index"])}
            for name, value in _fixture_gpu(mode).items():
                assert series(samples, name, **key) == pytest.approx(value, rel=1e-12), name
            assert series(samples, "iadeep_gpu_info", **key, model="NVIDIA H200",
                          uuid=gpu["uuid"]) == 1.0
            assert series(samples, "iadeep_gpu_jobs", **key) == len(gpu["jobs"])
            # the replayed processes, and any job process of this machine that the stand-in
            # lists but this node's poll does not claim (all test nodes share one /proc)
            rows = (FIXTURES / f"h200-{mode}-compute-apps-full.csv-noheader-nounits.txt")
            assert series(samples, "iadeep_gpu_foreign_processes", **key) >= \
                (len(rows.read_text().splitlines()) if gpu["index"] == 0 else 0)
    assert series(samples, "iadeep_node_up", node="node01") == 1.0
    assert series(samples, "iadeep_gpu_memory_used_bytes", node="node01", gpu="0") == \
        64172 * MIB   # the loaded H200's reading (the fixture's own number, spelled out)

    # the running job's predicted speed, labelled with who and where
    def placed(s):
        return [(n["name"], g["index"], j) for n in s["nodes"] for g in n["gpus"]
                for j in g["jobs"]]
    samples, on_gpus = _consistent(home, url, placed)
    status = _status(home)
    [(node, index, job)] = on_gpus
    assert job["id"] == long and job["predicted_speed"] is not None
    labels = {"job": str(long), "user": job["user"], "name": "train", "node": node,
              "gpus": str(index)}
    assert series(samples, "iadeep_job_predicted_speed_ratio", **labels) == \
        job["predicted_speed"]
    observed = series(samples, "iadeep_job_observed_speed_ratio", **labels)
    assert observed == job["observed_speed"]   # None (absent) until the job was measured

    # queue wait: the two jobs that started, from submission to their first start
    waits = []
    for job_id in (long, failing):
        shown = json.loads(cli(home, "queue", "show", str(job_id), "--json").stdout)
        first = min(e["at"] for e in shown["events"] if e["new_state"] == "starting")
        waits.append(first - shown["submitted_at"])
    assert series(samples, "iadeep_queue_wait_seconds_count") == 2
    assert series(samples, "iadeep_queue_wait_seconds_sum") == pytest.approx(sum(waits))
    assert series(samples, "iadeep_queue_wait_seconds_bucket", le="+Inf") == 2
    assert series(samples, "iadeep_queue_wait_seconds_bucket", le="60.0") == \
        sum(w <= 60 for w in waits)

    # the loop's rounds are timed; the controller's own process is described
    assert series(samples, "iadeep_round_duration_seconds_count") >= 1
    assert series(samples, "iadeep_round_duration_seconds_sum") > 0
    assert series(samples, "iadeep_controller_degraded") == 0.0
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes",
            "iadeep_round_last_end_time_seconds",
            "iadeep_controller_start_time_seconds"} <= names(samples)

    # a node that goes silent: down, unreachable, and its old GPU readings are not served
    other = "node02" if node == "node01" else "node01"
    lab.cluster.stop(other)
    down = wait_until(lambda: (s := scrape(url)) and
                      series(s, "iadeep_node_reachable", node=other) == 0.0 and
                      series(s, "iadeep_node_up", node=node) == 1.0 and s, limit=60)
    assert series(down, "iadeep_node_up", node=other) == 0.0
    assert series(down, "iadeep_node_state", node=other, state="down") == 1.0
    assert series(down, "iadeep_gpu_memory_used_bytes", node=other, gpu="0") is None
    assert series(down, "iadeep_gpu_info", node=other, gpu="0", model="NVIDIA H200",
                  uuid=next(g["uuid"] for n in status["nodes"] if n["name"] == other
                            for g in n["gpus"] if g["index"] == 0)) == 1.0


def test_lab_metrics_in_the_inventory_turns_them_on(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    inventory = _inventory(cluster, tmp_path, "  metrics:\n    listen: 127.0.0.1:0\n")
    ctl = start_lab(cluster, tmp_path, inventory)
    try:
        url = _metrics_url(ctl)
        assert series(scrape(url), "iadeep_jobs", state="queued") == 0.0
        # once polled, each node of this inventory has its series
        wait_until(lambda: all(series(scrape(url), "iadeep_node_up", node=n) is not None
                               for n in cluster.nodes), limit=60)
    finally:
        ctl.stop()


def test_the_deprecated_gpu_hour_gauges_are_served_beside_seconds_only_when_the_lab_asks(
        sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    inventory = _inventory(cluster, tmp_path, "  metrics:\n    listen: 127.0.0.1:0\n"
                                              "    legacy_hours: true\n")
    ctl = start_lab(cluster, tmp_path, inventory)
    try:
        url = _metrics_url(ctl)
        queue_add(ctl.home, str(ROOT / "jobs/hello.sh"), "--workload", "resnet50")

        def both():
            samples = scrape(url)
            return samples if series(samples, "iadeep_work_gpu_seconds", window="start") \
                else None
        samples = wait_until(both, limit=90)
        assert series(samples, "iadeep_work_gpu_hours", window="start") == pytest.approx(
            series(samples, "iadeep_work_gpu_seconds", window="start") / 3600, rel=1e-6)
        assert series(samples, "iadeep_busy_gpu_hours", window="start") == pytest.approx(
            series(samples, "iadeep_busy_gpu_seconds", window="start") / 3600, rel=1e-6)
    finally:
        ctl.stop()


def test_without_metrics_nothing_is_served(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    ctl = start_lab(cluster, tmp_path, _inventory(cluster, tmp_path))
    try:
        assert "Prometheus" not in ctl.log.read_text()
    finally:
        ctl.stop()


def _one_line_error(proc, *parts: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("Error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for part in parts:
        assert part in proc.stderr, proc.stderr


def test_a_busy_port_is_a_one_line_error(tmp_path):
    home = tmp_path / "state"
    home.mkdir()
    (home / "nodes.yaml").write_text("nodes: []\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli(home, "controller", "run", "--metrics", f"127.0.0.1:{port}")
    _one_line_error(proc, f"metrics address 127.0.0.1:{port} is already in use",
                    "choose another port")
    # it gave up cleanly: the state directory is free for the next start
    assert not (home / "controller.sock").exists()


@pytest.mark.parametrize("how", ["flag", "lab"])
def test_an_address_beyond_loopback_needs_the_labs_consent(tmp_path, how):
    home = tmp_path / "state"
    home.mkdir()
    if how == "flag":
        (home / "nodes.yaml").write_text("nodes: []\n")
        proc = cli(home, "controller", "run", "--metrics", "0.0.0.0:9464")
        _one_line_error(proc, "metrics address 0.0.0.0:9464 is not loopback",
                        "lab.metrics.allow_remote: true")
    else:
        (home / "nodes.yaml").write_text("lab:\n  metrics: {listen: ':9464'}\nnodes: []\n")
        proc = cli(home, "controller", "run")
        _one_line_error(proc, "nodes.yaml:2: lab.metrics.listen: not a loopback address")


def test_a_scrape_never_waits_for_the_writer_and_sees_only_committed_state(tmp_path):
    """The collector reads through its own read-only connection: a scrape answers while the
    loop holds the store (its lock, an open write transaction), and shows what was committed
    before that transaction, never half of it."""
    from iadeep_cli.controller.runtime import Controller
    from iadeep_cli.jobs import JobSpec
    from iadeep_cli.settings import Inventory
    from iadeep_cli.store import jobrows

    ctl = Controller(Inventory(nodes=()), tmp_path / "state", metrics=("127.0.0.1", 0))
    ctl._serve_metrics()
    assert ctl.metrics is not None
    try:
        url = ctl.metrics.url
        assert series(scrape(url), "iadeep_jobs", state="queued") == 0.0
        seen: list[dict] = []
        with ctl.store.tx() as conn:   # what a round holds while it writes
            jobrows.insert(conn, "alice", JobSpec("/x.sh"), 1.0)
            reader = threading.Thread(target=lambda: seen.append(scrape(url)))
            reader.start()
            reader.join(120)
            assert not reader.is_alive(), "the scrape waited for the writer"
        assert series(seen[0], "iadeep_jobs", state="queued") == 0.0   # not committed yet
        assert series(scrape(url), "iadeep_jobs", state="queued") == 1.0
    finally:
        ctl.metrics.close()
        ctl.socket.close()
        ctl.store.close()


def test_idle_connections_to_the_metrics_port_cannot_take_the_controller_down(tmp_path):
    """One address opens 300 connections to the metrics port and sends nothing, against a
    controller with 128 open files: it gets its few (dropped once idle), the rest are closed at
    once, and the controller keeps running: its heartbeat goes on, `status` answers, and a
    scrape from another address is served."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    ctl = ControllerProcess(tmp_path / "home", None, "--metrics", "127.0.0.1:0",
                            preexec_fn=low_limit).start()
    url = _metrics_url(ctl)
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])
    flood: list[socket.socket] = []
    try:
        for _ in range(300):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.settimeout(60)
            s.connect((host, port))
            flood.append(s)
        beat = _status(ctl.home)["controller"]["heartbeat_at"]
        wait_until(lambda: _status(ctl.home)["controller"]["heartbeat_at"] > beat, limit=120)
        assert series(scrape(url), "iadeep_controller_degraded") == 0.0
        assert ctl.proc.poll() is None
        # all but the few it kept were closed at once; the few, once idle
        closed = [s for s in flood if s.recv(1) == b""]
        assert len(closed) == len(flood)
        assert ctl.proc.poll() is None and cli(ctl.home, "status").returncode == 0
        log = ctl.log.read_text()
        assert "Too many open files" not in log and "Traceback" not in log, log[-3000:]
        assert "connections open: closing the oldest idle one" in log
    finally:
        for s in flood:
            s.close()
        ctl.stop()


def test_idle_connections_from_chosen_addresses_cannot_keep_a_scrape_out(tmp_path):
    """Any local account chooses its source address on loopback: one keeps the metrics port's
    16 connections full of idle ones from 127.0.0.2-5 (4 each, which a per-address cap let
    through), topping them up before every scrape. All 30 scrapes from 127.0.0.1 are served
    (before: 24 of 30 refused)."""
    from iadeep_cli.controller.requests.metrics import METRICS_CONNECTIONS

    ctl = ControllerProcess(tmp_path / "home", None, "--metrics", "127.0.0.1:0").start()
    url = _metrics_url(ctl)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    idle: list[socket.socket] = []

    def hold(n: int) -> None:
        for i in range(n):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 4}", 0))
            s.settimeout(60)
            s.connect(("127.0.0.1", port))
            idle.append(s)

    try:
        served = 0
        for _ in range(30):
            hold(METRICS_CONNECTIONS)          # the cap full of idle connections again
            served += series(scrape(url), "iadeep_controller_degraded") == 0.0
        assert served == 30
        log = ctl.log.read_text()
        assert "Traceback" not in log, log[-3000:]
    finally:
        for s in idle:
            s.close()
        ctl.stop()

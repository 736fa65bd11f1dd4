"""`iadeep report`'s accounting over a real SQLite store, against numbers computed by hand.

The jobs are written with the store's own ``insert``/``transition`` (so the events are exactly
what the controller writes), at chosen times from T0 (noon, so every moment is one local day).
"""
import os
import subprocess
import sys
from datetime import datetime

import pytest

from iadeep_cli.cli.report import parse_time
from iadeep_cli.errors import InputError
from iadeep_cli.jobs import JobSpec, JobState
from iadeep_cli.store import Store, jobrows as jobs
from iadeep_cli.store.report import percentile, report

S = JobState
T0 = datetime(2026, 11, 2, 12, 0).timestamp()
SINCE, UNTIL, NOW = T0 + 1000, T0 + 5000, T0 + 4800


def _job(c, owner, gpus=1, workload=None, at=0.0, moves=(), node="n1", **speeds):
    """Insert a job submitted at T0+at and move it through ``moves`` ((state, T0+t) pairs)."""
    job_id, _ = jobs.insert(c, owner, JobSpec(script="/j.sh", gpus=gpus, workload=workload),
                            T0 + at)
    for state, t in moves:
        fields = {}
        if state is S.STARTING:
            fields = {"node": node, "started_at": T0 + t, "gpu_indices": tuple(range(gpus))}
        if state in (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMEOUT):
            fields = {"ended_at": T0 + t}
        jobs.transition(c, job_id, state, "test", "ctl", T0 + t, **fields)
    if speeds:
        jobs.update(c, job_id, **speeds)
    return job_id


@pytest.fixture
def conn(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as c:
        # alice, 2 GPUs: placed at 100, ran to 3710: 2 x 3610 s; waited 100 s
        _job(c, "alice", gpus=2, workload="resnet", moves=[
            (S.STARTING, 100), (S.RUNNING, 110), (S.SUCCEEDED, 3710)],
            predicted_speed=0.8, observed_speed=0.75)
        # alice, requeued after its node went silent: 800 s + 800 s on 1 GPU (the lost
        # 100 s not counted); waited 200 s (to its FIRST start, not its last, 1300)
        _job(c, "alice", node="n2", moves=[
            (S.STARTING, 200), (S.RUNNING, 200), (S.LOST, 1000), (S.QUEUED, 1100),
            (S.STARTING, 1300), (S.RUNNING, 1300), (S.FAILED, 2100)])
        # bob, cancelled while queued: no GPU time, no wait
        _job(c, "bob", workload="bert", at=50, moves=[(S.CANCELLED, 1500)])
        # bob, 4 GPUs for 3600 s; waited 1000 s
        _job(c, "bob", gpus=4, workload="bert", moves=[
            (S.STARTING, 1000), (S.RUNNING, 1000), (S.TIMEOUT, 4600)],
            predicted_speed=1.0, observed_speed=0.9)
        # carol ended after the window, dave before it: neither is counted
        _job(c, "carol", moves=[(S.STARTING, 10), (S.RUNNING, 10), (S.SUCCEEDED, 6000)])
        _job(c, "dave", moves=[(S.STARTING, 10), (S.RUNNING, 10), (S.SUCCEEDED, 900)])
        # erin, running since 3000 on 1 GPU: 1800 s by NOW; waited 3000 s
        _job(c, "erin", moves=[(S.STARTING, 3000), (S.RUNNING, 3000)])
    with store.tx() as c:
        yield c
    store.close()


def test_total_over_finished_jobs(conn):
    rep = report(conn, SINCE, UNTIL, now=NOW)
    t = rep.total
    assert t.jobs == 4 and rep.groups == ()
    assert t.states == {"succeeded": 1, "failed": 1, "cancelled": 1, "timeout": 1}
    assert t.gpu_hours == pytest.approx((2 * 3610 + 800 + 800 + 4 * 3600) / 3600)   # 6.45
    # waits 100, 200, 1000: p50 the middle one; p95 at rank 1.9: 200 + 0.9 * 800
    assert (t.wait_p50_s, t.wait_p95_s) == pytest.approx((200, 920))
    assert (t.predicted_speed, t.with_predicted) == (pytest.approx(0.9), 2)
    assert (t.observed_speed, t.with_observed) == (pytest.approx(0.825), 2)


def test_by_user_and_one_user(conn):
    rep = report(conn, SINCE, UNTIL, by="user", now=NOW)
    alice, bob = rep.groups
    assert (alice.key, alice.jobs, bob.key, bob.jobs) == ("alice", 2, "bob", 2)
    assert alice.gpu_hours == pytest.approx(8820 / 3600)
    assert (alice.wait_p50_s, alice.wait_p95_s) == pytest.approx((150, 195))
    assert bob.gpu_hours == pytest.approx(4.0)
    assert (bob.wait_p50_s, bob.wait_p95_s) == (1000, 1000)
    only = report(conn, SINCE, UNTIL, user="bob", by="workload", now=NOW)
    assert [(g.key, g.jobs) for g in only.groups] == [("bert", 2)]
    assert only.total.gpu_hours == pytest.approx(4.0)


def test_by_node_workload_and_day(conn):
    by_node = report(conn, SINCE, UNTIL, by="node", now=NOW)
    # the job cancelled in the queue never had a node
    assert [(g.key, g.jobs) for g in by_node.groups] == [("-", 1), ("n1", 2), ("n2", 1)]
    assert by_node.groups[2].gpu_hours == pytest.approx(1600 / 3600)
    by_workload = report(conn, SINCE, UNTIL, by="workload", now=NOW)
    assert [g.key for g in by_workload.groups] == ["-", "bert", "resnet"]
    by_day = report(conn, SINCE, UNTIL, by="day", now=NOW)
    assert [(g.key, g.jobs) for g in by_day.groups] == [("2026-11-02", 4)]


def test_running_jobs_count_up_to_now(conn):
    rep = report(conn, SINCE, UNTIL, running=True, now=NOW)
    t = rep.total
    assert t.jobs == 5 and t.states["running"] == 1
    assert t.gpu_hours == pytest.approx(6.45 + 1800 / 3600)
    # waits 100, 200, 1000, 3000: p50 at rank 1.5 -> 600; p95 at rank 2.85 -> 1000 + 0.85 * 2000
    assert (t.wait_p50_s, t.wait_p95_s) == pytest.approx((600, 2700))


def test_empty_window(conn):
    rep = report(conn, T0 + 7000, T0 + 8000, by="user", now=NOW)
    assert rep.groups == () and rep.total.jobs == 0 and rep.total.gpu_hours == 0
    assert rep.total.wait_p50_s is None and rep.total.predicted_speed is None


def test_percentile_by_hand():
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(101))), 95) == 95.0


def test_parse_time():
    now = T0
    assert parse_time("7d", "--since", now) == now - 7 * 86400
    assert parse_time("90m", "--since", now) == now - 5400
    assert parse_time("now", "--until", now) == now
    assert parse_time("2026-11-02", "--since", now) == T0 - 12 * 3600
    assert parse_time("2026-11-02T12:30", "--until", now) == T0 + 1800
    for bad in ("yesterday", "7x", "2026-13-01", "-3d", ""):
        with pytest.raises(InputError, match="is not a time"):
            parse_time(bad, "--since", now)


def test_cli_offers_the_store_groupings():
    from iadeep_cli.cli import report as cli_report
    from iadeep_cli.store import report as store_report

    assert cli_report.GROUPINGS == store_report.GROUPINGS


def test_percentiles_per_group_and_over_all_match_the_definition(tmp_path):
    """Over many random waits in two groups, each group's p50/p95 and the total's (over every
    wait, not a mean of the groups') equal ``percentile`` over those waits."""
    import random

    rng = random.Random(3)
    store = Store(tmp_path / "iadeep.db")
    waits: dict[str, list[float]] = {"u1": [], "u2": []}
    with store.tx() as c:
        for i in range(120):
            owner = "u1" if i % 3 else "u2"
            wait = round(rng.uniform(0, 5000), 3)
            waits[owner].append(wait)
            _job(c, owner, at=0, moves=[(S.STARTING, wait), (S.RUNNING, wait),
                                        (S.SUCCEEDED, 6000 + i)])
    with store.tx() as c:
        rep = report(c, T0, T0 + 9000, by="user", now=NOW)
    store.close()
    everything = sorted(waits["u1"] + waits["u2"])
    for g in (*rep.groups, rep.total):
        mine = sorted(waits[g.key]) if g.key in waits else everything
        assert g.wait_p50_s == pytest.approx(percentile(mine, 50), abs=1e-6)
        assert g.wait_p95_s == pytest.approx(percentile(mine, 95), abs=1e-6)


def test_start_up_runs_none_of_what_the_report_does_not_need(tmp_path):
    """Every command imports every command module, so what they import at their top is every
    command's start-up (half of `iadeep report`'s second over a busy year, measured in
    benchmarks/bench_report.py). The request/reply types and the client are loaded lazily
    (cli/lazy.py), the inventory inside the commands that read it, and parsing the options may
    not pull in pydantic (typer 0.29 did, for every option). The lazy modules still work when a
    command uses them."""
    Store(tmp_path / "iadeep.db").close()
    code = """
import sys
from iadeep_cli.cli.main import main
sys.argv = ["iadeep", "report", "--since", "7d", "--by", "user"]
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
def ran(name):   # a lazy module sits in sys.modules before it runs; its class says whether it ran
    return name in sys.modules and type(sys.modules[name]).__name__ != "_LazyModule"
print(sorted(n for n in ("iadeep_cli.messages", "iadeep_cli.controller.client",
                         "iadeep_cli.inventory", "yaml", "pydantic") if ran(n)))
from iadeep_cli.cli import lazy
print(lazy.messages.JobView.__name__, ran("iadeep_cli.messages"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "IADEEP_HOME": str(tmp_path)}
                         ).stdout.split("\n")
    assert out[-3] == "[]", f"executed at start-up: {out[-3]}"
    assert out[-2] == "JobView True"

"""The metrics collector over a real SQLite store, scripted state by state (no server): each
series' value, its labels, and the rules that are easy to get wrong (a requeued job's wait ends
at its first start; a stale node's GPU readings are not served; a job on two GPUs is one job)."""
from __future__ import annotations

import pytest

from iadeep_cli.controller.requests.metrics import WAIT_BUCKETS, LabCollector
from iadeep_cli.jobs import JobSpec, JobState as S
from iadeep_cli.settings import Inventory, Node
from iadeep_cli.snapshot import GpuProcess, GpuSample, NodeSnapshot
from iadeep_cli.store import Store, cluster, jobrows

NOW = 100_000.0
MIB = 1024 * 1024
INVENTORY = Inventory(nodes=(Node("n1", "h1"), Node("n2", "h2")), poll_interval_s=10.0,
                      node_grace_s=60.0)


def _gpu(index: int, used: float, procs=()) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", name="NVIDIA H200",
                     memory_total_mib=143771.0, memory_used_mib=used, utilization_gpu=37.0,
                     temperature_c=40.0, power_draw_w=250.5, power_limit_w=700.0,
                     processes=tuple(procs))


def samples(collector) -> dict:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in collector.collect() for s in family.samples}


def get(out, metric, /, **labels):
    return out.get((metric, frozenset(labels.items())))


@pytest.fixture
def lab(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as conn:   # history from before the collector began: not a queue wait
        old, _ = jobrows.insert(conn, "carol", JobSpec("/old.sh"), NOW - 9000)
        jobrows.transition(conn, old, S.STARTING, "placed", "controller", NOW - 8000)
    collector = LabCollector(store.path, lambda: INVENTORY, lambda: False, NOW - 500,
                             clock=lambda: NOW)
    yield store, collector
    collector.close()
    store.close()


def test_series_follow_the_recorded_state(lab):
    store, collector = lab
    with store.tx() as conn:
        wide, _ = jobrows.insert(conn, "alice", JobSpec("/a.sh", gpus=2, name="wide"), NOW - 130)
        jobrows.transition(conn, wide, S.STARTING, "placed", "controller", NOW - 100,
                           node="n1", gpu_indices=(0, 1), predicted_speed=0.8)
        jobrows.transition(conn, wide, S.RUNNING, "running", "controller", NOW - 99)
        jobrows.update(conn, wide, observed_speed=0.75)
        # placed, given back (the launch never happened), placed again: one wait, to the first
        again, _ = jobrows.insert(conn, "bob", JobSpec("/b.sh", name="again"), NOW - 4000)
        jobrows.transition(conn, again, S.STARTING, "placed", "controller", NOW - 3900,
                           node="n1", gpu_indices=(0,))
        jobrows.transition(conn, again, S.QUEUED, "not started", "controller", NOW - 3800,
                           node=None, gpu_indices=())
        jobrows.transition(conn, again, S.STARTING, "placed", "controller", NOW - 10,
                           node="n1", gpu_indices=(0,), predicted_speed=0.9)
        jobrows.insert(conn, "bob", JobSpec("/c.sh"), NOW - 5)   # waits
        cluster.save_nodes(conn, (
            NodeSnapshot("n1", NOW - 2, (
                _gpu(0, 2048.0, [GpuProcess(11, 100.0, "python", wide),
                                 GpuProcess(12, 200.0, "python", None)]),
                _gpu(1, 1024.0, [GpuProcess(11, 100.0, "python", wide)])),
                rtt_s=0.004, jobs=()),
            NodeSnapshot("n2", NOW - 600, (_gpu(0, 512.0),), rtt_s=0.01, jobs=())))
    out = samples(collector)

    assert {s.value: get(out, "iadeep_jobs", state=s.value) for s in S} == {
        **{s.value: 0.0 for s in S}, "queued": 1.0, "starting": 2.0, "running": 1.0}

    for gpu, used in ((0, 2048.0), (1, 1024.0)):
        key = {"node": "n1", "gpu": str(gpu)}
        assert get(out, "iadeep_gpu_memory_used_bytes", **key) == used * MIB
        assert get(out, "iadeep_gpu_memory_total_bytes", **key) == 143771.0 * MIB
        assert get(out, "iadeep_gpu_utilization_ratio", **key) == pytest.approx(0.37)
        assert get(out, "iadeep_gpu_power_draw_watts", **key) == 250.5
        assert get(out, "iadeep_gpu_power_limit_watts", **key) == 700.0
        assert get(out, "iadeep_gpu_temperature_celsius", **key) == 40.0
        assert get(out, "iadeep_gpu_info", **key, model="NVIDIA H200", uuid=f"GPU-{gpu}") == 1
    assert get(out, "iadeep_gpu_jobs", node="n1", gpu="0") == 2.0   # wide and again
    assert get(out, "iadeep_gpu_jobs", node="n1", gpu="1") == 1.0
    assert get(out, "iadeep_gpu_foreign_processes", node="n1", gpu="0") == 1.0
    assert get(out, "iadeep_gpu_foreign_processes", node="n1", gpu="1") == 0.0

    # one series per job, whatever its number of GPUs
    wide_labels = {"job": str(wide), "user": "alice", "name": "wide", "node": "n1",
                   "gpus": "0,1"}
    assert get(out, "iadeep_job_predicted_speed_ratio", **wide_labels) == 0.8
    assert get(out, "iadeep_job_observed_speed_ratio", **wide_labels) == 0.75
    again_labels = {"job": str(again), "user": "bob", "name": "again", "node": "n1",
                    "gpus": "0"}
    assert get(out, "iadeep_job_predicted_speed_ratio", **again_labels) == 0.9
    assert get(out, "iadeep_job_observed_speed_ratio", **again_labels) is None   # not measured
    assert sum(name == "iadeep_job_predicted_speed_ratio" for name, _ in out) == 2

    # n1 fresh; n2's data is 600 s old (stale after max(3 polls, node_grace) = 60 s)
    assert get(out, "iadeep_node_up", node="n1") == 1.0
    assert get(out, "iadeep_node_up", node="n2") == 0.0
    assert get(out, "iadeep_node_state", node="n2", state="stale") == 1.0
    assert get(out, "iadeep_node_state", node="n2", state="up") == 0.0
    assert get(out, "iadeep_node_data_age_seconds", node="n2") == 600.0
    assert get(out, "iadeep_node_poll_rtt_seconds", node="n1") == 0.004
    assert get(out, "iadeep_gpu_memory_used_bytes", node="n2", gpu="0") is None
    assert get(out, "iadeep_gpu_jobs", node="n2", gpu="0") == 0.0   # what iadeep placed: known

    # waits of the jobs first started since the collector began: 30 s, and 100 s to the first
    # of again's two starts (not 3,990 s to its second); the job started before the collector
    # began (NOW - 8000) is not one of them
    assert get(out, "iadeep_queue_wait_seconds_count") == 2
    assert get(out, "iadeep_queue_wait_seconds_sum") == pytest.approx(130.0)
    for bound in WAIT_BUCKETS:
        assert get(out, "iadeep_queue_wait_seconds_bucket", le=str(bound)) == \
            (bound >= 30) + (bound >= 100)
    assert get(out, "iadeep_queue_wait_seconds_bucket", le="+Inf") == 2
    assert get(out, "iadeep_controller_start_time_seconds") == NOW - 500
    assert get(out, "iadeep_controller_degraded") == 0.0


def test_waits_are_counted_once_across_scrapes(lab):
    store, collector = lab
    with store.tx() as conn:
        first, _ = jobrows.insert(conn, "alice", JobSpec("/a.sh"), NOW - 50)
        jobrows.transition(conn, first, S.STARTING, "placed", "controller", NOW - 40)
    assert get(samples(collector), "iadeep_queue_wait_seconds_count") == 1
    assert get(samples(collector), "iadeep_queue_wait_seconds_count") == 1   # no new start
    with store.tx() as conn:
        jobrows.transition(conn, first, S.RUNNING, "running", "controller", NOW - 39)
        second, _ = jobrows.insert(conn, "bob", JobSpec("/b.sh"), NOW - 30)
        jobrows.transition(conn, second, S.STARTING, "placed", "controller", NOW - 10)
    out = samples(collector)
    assert get(out, "iadeep_queue_wait_seconds_count") == 2
    assert get(out, "iadeep_queue_wait_seconds_sum") == pytest.approx(10.0 + 20.0)


def test_a_degraded_controller_says_so(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    collector = LabCollector(store.path, lambda: INVENTORY, lambda: True, NOW, clock=lambda: NOW)
    try:
        out = samples(collector)
        assert get(out, "iadeep_controller_degraded") == 1.0
        assert not any(name.startswith("iadeep_node_") for name, _ in out)   # never polled
    finally:
        collector.close()
        store.close()


def test_idle_gpu_seconds_per_user_come_from_the_recorded_totals(lab):
    from iadeep_cli.store import cluster

    store, collector = lab
    assert not [k for k in samples(collector) if k[0].startswith("iadeep_idle_gpu_")]
    with store.tx() as conn:
        cluster.set_meta(conn, cluster.IDLE_GPU_SECONDS, {"alice": 5400.0, "bob": 36.0})
    out = samples(collector)
    assert get(out, "iadeep_idle_gpu_seconds", user="alice") == 5400.0
    assert get(out, "iadeep_idle_gpu_seconds", user="bob") == 36.0
    assert get(out, "iadeep_idle_gpu_hours", user="alice") is None   # lab.metrics.legacy_hours

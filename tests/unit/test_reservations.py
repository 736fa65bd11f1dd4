"""Reservations in the pure planner: which GPUs one holds, who keeps off them and when."""
from __future__ import annotations

import dataclasses

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, plan
from iadeep_cli.scheduler.reservations import Reservation, assign
from iadeep_cli.settings import Policy
from iadeep_cli.sim.truth import TruthModel
from iadeep_cli.text import parse_moment

PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
GIB = 1024.0
H = 3600.0


def job(id, owner, *, limit=None, gpus=1, node=None, idx=()):
    spec = JobSpec(f"/s/{id}.sh", workload="resnet18", gpus=gpus, time_limit_s=limit,
                   exclusive=True)
    state = JobState.RUNNING if node else JobState.QUEUED
    return Job(id, owner, spec, state, 0.0, node=node, gpu_indices=tuple(idx))


def slot(node, index, jobs=()):
    return GpuSlot(node, index, 141 * GIB, 140 * GIB, tuple(jobs), 2)


SLOTS = [slot("a", 0), slot("a", 1), slot("b", 0), slot("b", 1)]


def placed(queue, reservations, now, slots=SLOTS, active=()):
    p = plan(queue, slots, list(active), now,
             PlanInputs(PROFILES, TRUTH, Policy(), reservations=reservations))
    return {x.job_id: f"{x.node}:{','.join(map(str, x.gpu_indices))}" for x in p.placements}, \
        p.waits


ALICE_ON_A = Reservation(1, "alice", 2, "a", start=10 * H, end=18 * H)


def test_others_jobs_that_would_reach_into_the_window_keep_off_the_reserved_gpus():
    # bob's 2-GPU job fits only on a whole node: a is kept for alice from 10h, so b
    got, _ = placed([job(1, "bob", gpus=2, limit=12 * H)], [ALICE_ON_A], now=0.0,
                    slots=SLOTS)
    assert got == {1: "b:0,1"}
    # b busy too: bob's job waits, and says which reservation keeps it off a
    busy = [slot("a", 0), slot("a", 1), slot("b", 0, [9]), slot("b", 1, [9])]
    running = [job(9, "carol", node="b", idx=(0, 1), gpus=2)]
    got, waits = placed([job(1, "bob", gpus=2, limit=12 * H)], [ALICE_ON_A], 0.0, busy,
                        running)
    assert got == {} and "a:0,a:1 kept by reservation 1 for alice from " in waits[1]


def test_a_job_that_ends_before_the_window_may_use_the_gpus_and_the_owner_always():
    short = job(1, "bob", gpus=2, limit=9 * H)       # ends at 9h, the window opens at 10h
    busy = [slot("a", 0), slot("a", 1), slot("b", 0, [9]), slot("b", 1, [9])]
    running = [job(9, "carol", node="b", idx=(0, 1), gpus=2)]
    assert placed([short], [ALICE_ON_A], 0.0, busy, running)[0] == {1: "a:0,1"}
    # inside the window: alice's job (no limit) takes them; bob's, however short, does not
    assert placed([job(2, "alice", gpus=2)], [ALICE_ON_A], 11 * H, busy, running)[0] == \
        {2: "a:0,1"}
    got, waits = placed([job(3, "bob", gpus=1, limit=60)], [ALICE_ON_A], 11 * H, busy, running)
    assert got == {} and "reservation 1 for alice until" in waits[3]
    # a job without a time limit could run into any window not over yet
    got, waits = placed([job(4, "bob", gpus=2)], [ALICE_ON_A], 0.0, busy, running)
    assert got == {} and "without --time" in waits[4]
    # after the window: anyone's again
    assert placed([job(5, "bob", gpus=2)], [ALICE_ON_A], 18 * H, busy, running)[0] == \
        {5: "a:0,1"}


def test_without_a_node_it_holds_the_node_least_used_by_others_and_never_a_gpu_twice():
    running = [job(9, "carol", node="a", idx=(0,))]
    slots = [slot("a", 0, [9]), slot("a", 1), slot("b", 0), slot("b", 1)]
    two = [Reservation(1, "alice", 1, None, 0.0, H), Reservation(2, "dave", 2, "b", 0.0, H)]
    held = assign([Reservation(3, "alice", 2, None, 0.0, H)], slots, {9: "carol"}, 0.0)
    assert held == {3: ("b:0", "b:1")}
    held = assign(two, slots, {9: "carol"}, 0.0)
    assert held[2] == ("b:0", "b:1") and held[1] == ("a:1",)
    got, waits = placed([job(1, "bob", limit=60)], two, 0.0, slots, running)
    assert got == {} and "reservation 1 for alice" in waits[1] and \
        "reservation 2 for dave" in waits[1]
    over = dataclasses.replace(two[0], end=0.0)
    assert assign([over], slots, {}, 0.0) == {}


def test_parse_moment_reads_iso_times_and_now():
    assert parse_moment("now", 5.0) == 5.0
    assert parse_moment("2026-12-10T09:00+00:00", 0.0) == 1796893200.0
    assert parse_moment("tomorrow", 0.0) is None


def test_a_node_whose_polls_all_failed_has_an_unknown_gpu_count_not_zero(tmp_path):
    """A reservation made before a node's first good poll (its first one timed out on a loaded
    machine) was refused with "node01 has 0 GPU(s)"; what the node has is not known yet."""
    from iadeep_cli.controller.requests.reservations import _gpu_counts
    from iadeep_cli.inventory import parse_inventory
    from iadeep_cli.snapshot import GpuSample, NodeSnapshot
    from iadeep_cli.store import Store, cluster

    inventory = parse_inventory("nodes:\n  - name: node01\n    host: 127.0.0.2\n"
                                "  - name: node02\n    host: 127.0.0.3\n", tmp_path / "n.yaml")
    gpu = GpuSample(index=0, uuid="GPU-0", name="NVIDIA H200", memory_total_mib=143771)
    store = Store(tmp_path / "iadeep.db")
    try:
        with store.tx() as conn:
            cluster.save_nodes(conn, (NodeSnapshot("node01", 1.0, (), error="timed out"),
                                      NodeSnapshot("node02", 1.0, (gpu,), jobs=())))
            assert _gpu_counts(conn, inventory) == {"node01": None, "node02": 1}
            cluster.save_nodes(conn, (NodeSnapshot("node01", 2.0, (gpu, gpu), jobs=()),
                                      NodeSnapshot("node02", 2.0, (), error="timed out")))
            # a failed poll after a good one keeps the good one's GPUs
            assert _gpu_counts(conn, inventory) == {"node01": 2, "node02": 1}
    finally:
        store.close()

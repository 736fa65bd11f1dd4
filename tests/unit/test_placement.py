"""The placement policy as a pure function, checked against the measured H200 data.

Expected speeds come from the shipped CSVs (read here with the csv module), never from the code
under test. The model is the measured-truth table, so the rules are tested, not the predictor.
"""
from __future__ import annotations

import csv
import dataclasses
from importlib import resources

import pytest

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, plan, slots_from_snapshot
from iadeep_cli.scheduler.priority import effective_priority, order_queue
from iadeep_cli.settings import Inventory, Node, Policy, UserLimit
from iadeep_cli.sim.truth import TruthModel
from iadeep_cli.snapshot import ClusterSnapshot, GpuProcess, GpuSample, NodeSnapshot

PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
POLICY = Policy()
GIB = 1024.0


def measured(a: str, b: str) -> tuple[float, float]:
    """(speed of a, speed of b) straight from the shipped pairs.csv."""
    text = resources.files("iadeep_cli").joinpath("data", "h200", "pairs.csv").read_text()
    for row in csv.DictReader(text.splitlines()):
        if (row["job_a"], row["job_b"]) == (a, b):
            return float(row["speed_a"]), float(row["speed_b"])
        if (row["job_a"], row["job_b"]) == (b, a):
            return float(row["speed_b"]), float(row["speed_a"])
    raise KeyError((a, b))


def job(id, workload="resnet18", *, t=0.0, gpus=1, prio=0, owner="alice", exclusive=False,
        mem=None, floor=None, node=None, idx=()):
    spec = JobSpec(f"/s/{id}.sh", workload=workload, gpus=gpus, priority=prio,
                   exclusive=exclusive, mem_gib=mem, min_speed=floor)
    state = JobState.RUNNING if node else JobState.QUEUED
    return Job(id, owner, spec, state, t, node=node, gpu_indices=tuple(idx))


def slot(node="a", index=0, free_gib=140.0, jobs=(), max_jobs=2, foreign_gib=0.0):
    return GpuSlot(node, index, 141 * GIB, free_gib * GIB, tuple(jobs), max_jobs, foreign_gib * GIB)


def run(queue, slots, active=(), policy=POLICY, limits=None, now=0.0, model=TRUTH):
    return plan(queue, slots, list(active), now,
                PlanInputs(PROFILES, model, policy, limits or {}))


def where(p, job_id):
    return next(((x.node, x.gpu_indices) for x in p.placements if x.job_id == job_id), None)


# --------------------------------------------------------------------------- memory
def test_memory_counts_foreign_processes():
    # 130 GiB held by a foreign process leaves 11 GiB: transformer (10.2 + 2 margin) cannot fit.
    need = PROFILES["transformer"].peak_mem_gib + POLICY.memory_margin_gib
    assert need > 11
    p = run([job(1, "transformer")], [slot(free_gib=11, foreign_gib=130)])
    assert p.placements == ()
    assert "GiB" in p.waits[1] and "a:0" in p.waits[1]
    p = run([job(2, "resnet18")], [slot(free_gib=11, foreign_gib=130)])
    assert where(p, 2) == ("a", (0,))


def test_explicit_mem_overrides_profile():
    p = run([job(1, "resnet18", mem=50)], [slot(free_gib=40), slot(index=1, free_gib=60)])
    assert where(p, 1) == ("a", (1,))


# --------------------------------------------------------------------------- sharing rules
def test_heavy_plus_heavy_refused_with_reason():
    resident = job(1, "resnet50", node="a", idx=(0,))
    pol = dataclasses.replace(POLICY, min_speed=0.5)
    p = run([job(2, "vgg16")], [slot(jobs=(1,))], active=[resident], policy=pol)
    assert p.placements == ()
    slow = min(measured("resnet50", "vgg16"))
    assert slow < pol.min_speed
    assert f"to {slow:.2f} on a:0 (floor 0.5)" in p.waits[2]


def test_heavy_plus_light_shares_with_predicted_speeds():
    resident = job(1, "resnet50", node="a", idx=(0,))
    p = run([job(2, "resnet18")], [slot(jobs=(1,))], active=[resident])
    assert where(p, 2) == ("a", (0,))
    s50, s18 = measured("resnet50", "resnet18")
    assert p.placements[0].predicted_speeds == pytest.approx({1: s50, 2: s18})


def test_combined_speed_threshold():
    # resnet50 + lstm: both stay near 0.5 but together they are slower than taking turns.
    a, b = measured("resnet50", "lstm")
    if min(a, b) >= 0.5:
        pytest.skip("data changed")
    pol = Policy(sharing="threshold", min_speed=0.3)
    resident = job(1, "resnet50", node="a", idx=(0,))
    p = run([job(2, "lstm")], [slot(jobs=(1,))], active=[resident], policy=pol)
    assert a + b < pol.share_threshold
    assert p.placements == () and "combined speed" in p.waits[2]


def test_per_job_floor_is_honoured():
    resident = job(1, "resnet50", node="a", idx=(0,))
    s50, _ = measured("resnet50", "resnet18")
    strict = job(2, "resnet18")
    p = run([strict], [slot(jobs=(1,))], active=[job(1, "resnet50", node="a", idx=(0,),
                                                     floor=s50 + 0.05)])
    assert p.placements == () and "floor" in p.waits[2]
    assert where(run([strict], [slot(jobs=(1,))], active=[resident]), 2) == ("a", (0,))


def test_max_jobs_per_gpu():
    active = [job(1, "mlp", node="a", idx=(0,)), job(2, "mlp", node="a", idx=(0,))]
    p = run([job(3, "mlp")], [slot(jobs=(1, 2), max_jobs=2)], active=active)
    assert p.placements == ()
    p = run([job(3, "mlp")], [slot(jobs=(1, 2), max_jobs=3)], active=active,
            policy=Policy(min_speed=0.2))
    assert where(p, 3) == ("a", (0,))


def test_exclusive_needs_an_empty_gpu_and_nobody_joins_it():
    resident = job(1, "resnet50", node="a", idx=(0,))
    p = run([job(2, "resnet18", exclusive=True)], [slot(jobs=(1,))], active=[resident])
    assert p.placements == () and "exclusive" in p.waits[2]
    lonely = job(1, "resnet50", node="a", idx=(0,), exclusive=True)
    p = run([job(3, "resnet18")], [slot(jobs=(1,))], active=[lonely])
    assert p.placements == ()


def test_multi_gpu_gets_whole_gpus_on_one_node():
    active = [job(1, "resnet50", node="a", idx=(0,))]
    slots = [slot("a", 0, jobs=(1,)), slot("a", 1), slot("b", 0), slot("b", 1)]
    p = run([job(2, "resnet50", gpus=2)], slots, active=active)
    assert where(p, 2) == ("b", (0, 1))


def test_multi_gpu_wait_reason_names_largest_node():
    active = [job(1, "resnet50", node="a", idx=(0,)), job(3, "vgg16", node="b", idx=(0,))]
    slots = [slot("a", 0, jobs=(1,)), slot("a", 1), slot("b", 0, jobs=(3,)), slot("b", 1)]
    p = run([job(2, "resnet50", gpus=2)], slots, active=active)
    assert p.waits[2] == ("needs 2 free GPUs on one node; largest is 1 (node a); "
                          "will reserve GPUs in 1h00m")


def test_unknown_profile_runs_alone_and_nothing_joins_it():
    resident = job(1, "resnet18", node="a", idx=(0,))
    p = run([job(2, None)], [slot(jobs=(1,))], active=[resident])
    assert p.waits[2] == ("no profile yet: waits for an empty GPU to profile on; "
                          "will reserve a GPU in 1h00m")
    p = run([job(2, "never-profiled")], [slot(jobs=(1,)), slot(index=1)], active=[resident])
    assert where(p, 2) == ("a", (1,))
    unknown = job(1, None, node="a", idx=(0,))
    p = run([job(3, "mlp")], [slot(jobs=(1,))], active=[unknown])
    assert p.placements == ()


# --------------------------------------------------------------------------- queue order
def test_priority_then_submission_time():
    q = [job(1, t=0.0), job(2, t=10.0, prio=3), job(3, t=5.0)]
    assert [j.id for j in order_queue(q, POLICY, now=20.0)] == [2, 1, 3]
    p = run(q, [slot()], now=20.0)
    assert p.placements[0].job_id == 2


def test_ageing_lets_old_low_priority_job_overtake():
    old, new = job(1, t=0.0, prio=0), job(2, t=10 * 3600.0, prio=5)
    now = 10 * 3600.0 + 1
    # aged 10 h at 1 point/h = 10 > 5
    assert effective_priority(old, POLICY, now) > effective_priority(new, POLICY, now)
    p = run([new, old], [slot()], now=now)
    assert p.placements[0].job_id == 1
    p = run([new, old], [slot()], now=now, policy=Policy(aging_per_hour=0.0))
    assert p.placements[0].job_id == 2


def test_backfill_small_job_passes_blocked_big_one():
    q = [job(1, "resnet50", t=0.0, gpus=2), job(2, "resnet18", t=1.0)]
    slots = [slot("a", 0), slot("a", 1, jobs=(9,))]
    active = [job(9, "transformer", node="a", idx=(1,), exclusive=True)]
    p = run(q, slots, active=active, now=60.0)
    assert where(p, 2) == ("a", (0,)) and 1 in p.waits


def test_long_blocked_big_job_reserves_gpus_so_it_cannot_starve():
    q = [job(1, "resnet50", t=0.0, gpus=2), job(2, "resnet18", t=1.0)]
    slots = [slot("a", 0), slot("a", 1, jobs=(9,))]
    active = [job(9, "transformer", node="a", idx=(1,), exclusive=True)]
    p = run(q, slots, active=active, now=3 * 3600.0)
    assert p.placements == () and set(p.waits) == {1, 2}


def test_a_blocked_whole_gpu_job_says_when_it_reserves_gpus_and_which():
    q = [job(1, "resnet50", t=0.0, gpus=2), job(2, "resnet50", t=10.0, gpus=2)]
    slots = [slot("a", 0), slot("a", 1, jobs=(9,)), slot("b", 0, jobs=(8,))]
    active = [job(9, "transformer", node="a", idx=(1,), exclusive=True),
              job(8, "transformer", node="b", idx=(0,), exclusive=True)]
    early = run(q, slots, active=active, now=18 * 60.0)        # reserve_after_s: 1 h
    assert early.waits[1].endswith("; will reserve GPUs in 42m")
    assert early.waits[2].endswith("; will reserve GPUs in 43m")   # rounded up: 42m10s
    late = run(q, slots, active=active, now=2 * 3600.0)
    assert late.waits[1].endswith("; reserving a:0,1 while they drain "
                                  "(shorter jobs may use them until then)")
    assert late.waits[2].endswith("; job 1 reserves GPUs first")
    full = [slot("a", 0, jobs=(9,)), slot("a", 1, jobs=(8,))]   # no GPU free at all
    busy = [dataclasses.replace(j, node="a", gpu_indices=(i,)) for i, j in enumerate(active)]
    p = run(q[:1], full, active=busy, now=3000.0)
    assert p.waits[1] == ("needs 2 free GPUs on one node; all 2 GPUs are busy; "
                          "will reserve GPUs in 10m")


def test_reservation_waits_for_the_labs_reserve_after_s():
    q = [job(1, "resnet50", t=0.0, gpus=2), job(2, "resnet18", t=1.0)]
    slots = [slot("a", 0), slot("a", 1, jobs=(9,))]
    active = [job(9, "transformer", node="a", idx=(1,), exclusive=True)]
    patient = dataclasses.replace(POLICY, reserve_after_s=4 * 3600.0)
    assert where(run(q, slots, active=active, now=3 * 3600.0, policy=patient), 2) == ("a", (0,))
    eager = dataclasses.replace(POLICY, reserve_after_s=60.0)
    assert run(q, slots, active=active, now=120.0, policy=eager).placements == ()


def test_every_queued_job_is_placed_or_has_a_reason():
    q = [job(i, w, t=float(i)) for i, w in enumerate(
        ["resnet50", "vgg16", "transformer", "lstm", "ncf", "mlp", "resnet18", None] * 3)]
    p = run(q, [slot("a", i) for i in range(4)])
    placed = {x.job_id for x in p.placements}
    assert placed | set(p.waits) == {j.id for j in q} and not placed & set(p.waits)
    assert all(p.waits.values())


# --------------------------------------------------------------------------- choice
def test_no_queue_pressure_takes_empty_gpu():
    resident = job(1, "resnet50", node="a", idx=(0,))
    p = run([job(2, "resnet18")], [slot(jobs=(1,)), slot(index=1)], active=[resident])
    assert where(p, 2) == ("a", (1,))


def test_under_pressure_light_job_shares_and_leaves_empty_gpu_for_heavy():
    resident = job(1, "resnet50", node="a", idx=(0,))
    q = [job(2, "resnet18", t=0.0), job(3, "vgg16", t=1.0)]
    p = run(q, [slot(jobs=(1,)), slot(index=1)], active=[resident])
    assert where(p, 2) == ("a", (0,)) and where(p, 3) == ("a", (1,))


# --------------------------------------------------------------------------- user limits
def test_user_limits():
    active = [job(1, "mlp", node="a", idx=(0,), owner="alice")]
    q = [job(2, "mlp", owner="alice"), job(3, "mlp", owner="bob", t=1.0)]
    limits = {"alice": UserLimit(max_gpus=1)}
    p = run(q, [slot(jobs=(1,)), slot(index=1)], active=active, limits=limits)
    assert p.waits[2] == "user limit: alice may use 1 GPU at once; 1 in use, this job needs 1"
    assert where(p, 3) is not None
    wide = [job(4, "mlp", owner="bob", gpus=2)]
    p = run(wide, [slot(index=0), slot(index=1)], limits={"bob": UserLimit(max_gpus=1)})
    assert p.waits[4] == "user limit: bob may use 1 GPU at once; 0 in use, this job needs 2"
    p = run(q, [slot(jobs=(1,)), slot(index=1)], active=active,
            limits={"alice": UserLimit(max_jobs=1)})
    assert p.waits[2] == "user limit: alice already runs 1 of 1 jobs"


def test_user_limit_counts_placements_in_the_same_round():
    q = [job(1, "mlp", t=0.0), job(2, "mlp", t=1.0)]
    p = run(q, [slot(index=0), slot(index=1)], limits={"alice": UserLimit(max_jobs=1)})
    assert len(p.placements) == 1 and "user limit" in p.waits[2]


# --------------------------------------------------------------------------- snapshot -> slots
def _gpu(index, free, procs=()):
    return GpuSample(index, f"GPU-{index}", "NVIDIA H200", 143771.0, 143771.0 - free, free,
                     processes=tuple(procs))


def test_slots_from_snapshot():
    inv = Inventory(nodes=(Node("a", "h1", gpus=(0, 1)), Node("b", "h2", max_jobs_per_gpu=4),
                           Node("c", "h3")))
    snap = ClusterSnapshot(0.0, (
        NodeSnapshot("a", 0.0, (_gpu(0, 100000.0, [GpuProcess(7, 40000.0, "python")]),
                                _gpu(1, 143771.0), _gpu(2, 143771.0))),
        NodeSnapshot("b", 0.0, (_gpu(0, 143771.0),)),
        NodeSnapshot("c", 0.0, error="ssh: timed out"),
    ))
    started = job(5, "transformer", node="a", idx=(1,))   # launched, not visible yet
    slots = {s.name: s for s in slots_from_snapshot(snap, [started], inv, PROFILES)}
    assert set(slots) == {"a:0", "a:1", "b:0"}
    assert slots["a:0"].foreign_mib == 40000.0
    expected = (PROFILES["transformer"].peak_mem_gib + inv.policy.memory_margin_gib) * GIB
    assert slots["a:1"].memory_free_mib == pytest.approx(143771.0 - expected)
    assert slots["a:1"].job_ids == (5,)
    assert slots["b:0"].max_jobs == 4 and slots["a:0"].max_jobs == POLICY.max_jobs_per_gpu


def test_a_closed_node_offers_no_gpus_and_its_snapshot_still_reads_as_healthy():
    """A node the controller closes for the round (its launches keep failing) is left out of
    placement, yet its GPU data stays good: closing is not a poll error, and is never saved."""
    from iadeep_cli.snapshot import to_dict

    inv = Inventory(nodes=(Node("a", "h1"), Node("b", "h2")))
    closed = NodeSnapshot("a", 0.0, (_gpu(0, 143771.0),), closed="launches failing: disk full")
    snap = ClusterSnapshot(0.0, (closed, NodeSnapshot("b", 0.0, (_gpu(0, 143771.0),))))
    assert {s.name for s in slots_from_snapshot(snap, [], inv, PROFILES)} == {"b:0"}
    assert closed.ok and closed.error is None and not closed.placeable
    assert "closed" not in to_dict(closed)


def test_plan_with_the_fitted_predictor_refuses_heavy_pairs():
    from iadeep_cli.model.predictor import default_model
    resident = job(1, "transformer", node="a", idx=(0,))
    p = run([job(2, "vgg16")], [slot(jobs=(1,))], active=[resident], model=default_model())
    assert p.placements == ()
    p = run([job(2, "mlp")], [slot(jobs=(1,))], active=[job(1, "ncf", node="a", idx=(0,))],
            model=default_model())
    assert sum(measured("ncf", "mlp")) > 1.1
    assert where(p, 2) == ("a", (0,))


def test_a_job_no_gpu_can_ever_hold_waits_with_why_and_reserves_nothing():
    # --mem 500 (GiB) on 141 GiB GPUs, e.g. a value meant in MiB: it must not block the node.
    q = [job(1, "resnet50", t=0.0, gpus=2, mem=500), job(2, "resnet18", t=1.0)]
    slots = [slot("a", 0), slot("a", 1, jobs=(9,))]
    active = [job(9, "transformer", node="a", idx=(1,), exclusive=True)]
    p = run(q, slots, active=active, now=10 * 3600.0)
    assert "500.0 GiB" in p.waits[1] and "141.0 GiB" in p.waits[1] and "--mem" in p.waits[1]
    assert where(p, 2) == ("a", (0,))   # no reservation held for a job that can never run


def test_unknown_memory_needs_a_mostly_free_gpu():
    # no profile and no --mem: a GPU 90% held by a stranger's process would likely OOM it
    p = run([job(1, None)], [slot("a", 0, free_gib=14, foreign_gib=127), slot("a", 1)])
    assert where(p, 1) == ("a", (1,))
    p = run([job(1, None)], [slot("a", 0, free_gib=14, foreign_gib=127)])
    assert p.placements == () and 1 in p.waits


def test_a_resident_still_growing_into_its_memory_is_counted():
    from iadeep_cli.settings import Inventory, Node
    from iadeep_cli.snapshot import ClusterSnapshot, GpuProcess, GpuSample, NodeSnapshot
    resident = job(1, "resnet18", node="a", idx=(0,), mem=100)   # asked for 100 GiB
    seen = GpuProcess(pid=7, used_memory_mib=0.5 * GIB, job_id=1)   # shows 0.5 GiB so far
    gpu = GpuSample(0, "u", "NVIDIA H200", memory_total_mib=141 * GIB,
                    memory_used_mib=0.5 * GIB, memory_free_mib=140.5 * GIB, processes=(seen,))
    snap = ClusterSnapshot(0.0, (NodeSnapshot("a", 0.0, (gpu,)),))
    (s,) = slots_from_snapshot(snap, [resident], Inventory(nodes=(Node("a", "h"),)), PROFILES)
    assert s.memory_free_mib == pytest.approx(41 * GIB)   # 140.5 - (100 - 0.5)


# --------------------------------------------------------------------------- node rules
def ruled(id, workload="resnet18", *, gpus=1, t=0.0, **rules):
    """A queued job with --constraint/--nodelist/--exclude (``rules``, as JobSpec fields)."""
    base = job(id, workload, gpus=gpus, t=t)
    return dataclasses.replace(base, spec=dataclasses.replace(base.spec, **rules))


def labelled(node, index, labels, **kw):
    return dataclasses.replace(slot(node, index, **kw), labels=tuple(labels))


def test_constraint_places_only_on_nodes_with_every_label():
    slots = [labelled("a", 0, ["h200"]), labelled("b", 0, ["h200", "nvlink"]),
             labelled("c", 0, ["nvlink"])]
    p = run([ruled(1, constraint=("h200", "nvlink"))], slots)
    assert where(p, 1) == ("b", (0,))


def test_a_job_waits_rather_than_use_a_node_it_may_not_and_says_why():
    # b, the only node with the label, is full; a is empty but lacks it.
    slots = [labelled("a", 0, []), labelled("b", 0, ["a100"], jobs=[9])]
    busy = ruled(9, "transformer", constraint=())
    busy = dataclasses.replace(busy, state=JobState.RUNNING, node="b", gpu_indices=(0,),
                               spec=dataclasses.replace(busy.spec, exclusive=True))
    p = run([ruled(1, constraint=("a100",))], slots, active=[busy])
    assert p.placements == ()
    assert "it may run only on b" in p.waits[1] and "--constraint a100" in p.waits[1]


def test_nodelist_and_exclude_choose_among_nodes():
    slots = [labelled("a", 0, []), labelled("b", 0, []), labelled("c", 0, [])]
    assert where(run([ruled(1, nodelist=("c",))], slots), 1) == ("c", (0,))
    assert where(run([ruled(1, exclude=("a", "b"))], slots), 1) == ("c", (0,))
    assert where(run([ruled(1, nodelist=("a", "b"), exclude=("a",))], slots), 1) == ("b", (0,))


def test_multi_gpu_job_with_a_nodelist_takes_whole_gpus_on_an_allowed_node_only():
    slots = [labelled("a", i, []) for i in range(4)] + [labelled("b", i, []) for i in range(2)]
    # Best fit alone would take b (fewest empty GPUs); the rule leaves only a.
    p = run([ruled(1, "bert", gpus=2, nodelist=("a",))], slots)
    assert where(p, 1) is not None and where(p, 1)[0] == "a"


def test_no_matching_node_up_is_a_wait_naming_the_rule():
    p = run([ruled(1, nodelist=("gone",))], [labelled("a", 0, [])])
    assert p.placements == () and "--nodelist gone" in p.waits[1]


def test_jobs_without_rules_still_use_every_node_and_skip_a_ruled_ones_blockage():
    # Job 1 may only use b (busy); job 2 behind it is placed on a at once (backfill).
    slots = [labelled("a", 0, []), labelled("b", 0, [], free_gib=1)]
    p = run([ruled(1, nodelist=("b",), t=0.0), ruled(2, t=1.0)], slots)
    assert where(p, 2) == ("a", (0,)) and where(p, 1) is None


def test_slots_from_snapshot_carry_node_labels():
    inv = Inventory(nodes=(Node("n1", "h", labels=("h200",)),))
    snap = ClusterSnapshot(taken_at=0.0, nodes=(NodeSnapshot(
        "n1", 0.0, (_gpu(0, 143771.0),)),))
    assert slots_from_snapshot(snap, [], inv)[0].labels == ("h200",)


def test_a_job_too_big_for_every_gpu_it_may_use_says_the_largest_it_could_have():
    """The largest GPU is worked out once a round for jobs without a node rule, and among the
    allowed nodes for one with a rule; a GPU whose size is unknown means no such verdict."""
    def sized(node, total_gib):
        return dataclasses.replace(slot(node), memory_total_mib=total_gib * GIB,
                                   memory_free_mib=total_gib * GIB)

    slots = [sized("small", 40), sized("big", 141)]
    p = run([job(1, mem=100), job(2, mem=200), ruled(3, mem_gib=100, nodelist=("small",))],
            slots)
    assert where(p, 1) == ("big", (0,))
    assert "the largest GPU here has 141.0 GiB" in p.waits[2]
    assert "the largest GPU here has 40.0 GiB" in p.waits[3]
    unknown = [*slots, dataclasses.replace(slot("odd"), memory_total_mib=None)]
    p = run([job(2, mem=200)], unknown)
    assert "largest GPU" not in p.waits[2]


def test_a_user_limit_counts_gpus_not_jobs_sharing_one():
    """Four of alice's jobs on three GPUs (two share GPU 0) use 3 GPUs, not 4: with a limit
    of 4 her next job starts on the idle GPU instead of waiting beside it."""
    active = [job(1, "mlp", node="a", idx=(0,), owner="alice"),
              job(2, "mlp", node="a", idx=(0,), owner="alice"),
              job(3, "mlp", node="a", idx=(1,), owner="alice"),
              job(4, "mlp", node="a", idx=(2,), owner="alice")]
    q = [job(5, "mlp", owner="alice")]
    slots = [slot(index=0, jobs=(1, 2)), slot(index=1, jobs=(3,)), slot(index=2, jobs=(4,)),
             slot(index=3)]
    p = run(q, slots, active=active, limits={"alice": UserLimit(max_gpus=4)})
    assert where(p, 5) is not None, p.waits
    p = run(q, slots, active=active, limits={"alice": UserLimit(max_gpus=3)})
    assert p.waits[5] == "user limit: alice may use 3 GPUs at once; 3 in use, this job needs 1"

"""Mixed GPU models: the model key, the cross-model estimate, the Gavel-style choice in plan(),
and that a one-model cluster decides exactly as before (scheduler/gpumodels.py)."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.profiles import Profile, gpu_model_key
from iadeep_cli.scheduler.gpumodels import model_speeds, preference, queue_means
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, plan, slots_from_snapshot
from iadeep_cli.settings import Inventory, Node, Policy
from iadeep_cli.sim.mixed import derived_factor, sim_speeds
from iadeep_cli.sim.truth import TruthModel
from iadeep_cli.snapshot import ClusterSnapshot, GpuSample, NodeSnapshot

PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
GIB = 1024.0


def job(id, workload, *, t=0.0, node=None, idx=(), gpus=1):
    state = JobState.RUNNING if node else JobState.QUEUED
    return Job(id, "alice", JobSpec(f"/s/{id}.sh", workload=workload, gpus=gpus), state, t,
               node=node, gpu_indices=tuple(idx))


def slot(node, index, model, jobs=()):
    return GpuSlot(node, index, 80 * GIB, 80 * GIB, tuple(jobs), 2, gpu_model=model)


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H200", "h200"), ("NVIDIA H200 NVL", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("Tesla V100-SXM2-32GB", "v100"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA L40S", "l40s"), ("a100", "a100"), ("", ""),
])
def test_gpu_model_key(name, key):
    assert gpu_model_key(name) == key


def prof(w, model, it_s):
    return Profile(w, 50.0, 20.0, 1.0, gpu_model=model, solo_it_per_s=it_s)


def test_measured_on_both_is_the_measured_ratio_and_one_side_uses_the_lab_ratio():
    profs = [prof("a", "NVIDIA H200", 100.0), prof("a", "NVIDIA A100-SXM4-80GB", 50.0),
             prof("b", "NVIDIA H200", 10.0), prof("b", "NVIDIA A100-SXM4-80GB", 8.0),
             prof("c", "NVIDIA H200", 40.0), prof("e", "NVIDIA H200", 4.0),  # H200 only
             prof("d", "NVIDIA A100-SXM4-80GB", 5.0)]  # only on the A100
    sp = model_speeds(profs, ["h200", "a100"])
    assert sp.reference == "h200"   # the model with the most measured workloads
    assert sp.factor("a", "a100") == pytest.approx(0.5)
    assert sp.factor("b", "a100") == pytest.approx(0.8)
    lab = math.sqrt(0.5 * 0.8)       # geometric mean over the workloads measured on both
    assert sp.factor("c", "a100") == pytest.approx(lab)
    assert sp.factor("d", "a100") == pytest.approx(lab)
    assert sp.factor("never-seen", "a100") == pytest.approx(lab)
    assert sp.factor("c", "h200") == 1.0
    assert "measured on both" in sp.why("a", "a100")
    assert "estimated from the 2 workloads" in sp.why("c", "a100")


def test_no_workload_on_both_models_counts_them_equal_and_says_so():
    sp = model_speeds([prof("a", "NVIDIA H200", 100.0), prof("b", "NVIDIA A100", 9.0)],
                      ["h200", "a100"])
    other = "a100" if sp.reference == "h200" else "h200"
    assert sp.factor("a", other) == 1.0
    assert "taken as equal" in sp.why("a", other)


def test_preference_fastest_without_pressure_comparative_advantage_under_it():
    sp = sim_speeds(PROFILES, [("h200", 8), ("a100", 8)])
    assert sp.factor("mlp", "a100") == pytest.approx(derived_factor(PROFILES["mlp"], "a100"))
    means = queue_means(sp, ["mlp", "transformer", "transformer"])
    # nobody waits: every job takes the model where it is fastest
    assert preference(sp, "mlp", ["h200", "a100"], False, means)[0] == "h200"
    # under pressure the launch-bound mlp (0.90x on the a100) leaves the h200 to transformer
    assert preference(sp, "mlp", ["h200", "a100"], True, means)[0] == "a100"
    assert preference(sp, "transformer", ["h200", "a100"], True, means)[0] == "h200"


def test_plan_sends_each_job_where_it_gains_most():
    """Three jobs, one empty h200 and one empty a100: the first in line (mlp) loses little on
    the a100 and takes it; transformer, which runs at 0.46x there, gets the h200. Blind to
    the model (no speeds), mlp takes the first empty GPU, the h200."""
    slots = [slot("big", 0, "h200"), slot("old", 0, "a100")]
    q = [job(1, "mlp", t=0.0), job(2, "transformer", t=1.0), job(3, "transformer", t=2.0)]
    sp = sim_speeds(PROFILES, [("h200", 1), ("a100", 1)])
    pol = Policy(share_threshold=2.0)   # no sharing: the GPU model alone decides
    aware = plan(q, slots, [], 10.0,
                 PlanInputs(PROFILES, TRUTH, pol, speeds=sp))
    where = {p.job_id: p.node for p in aware.placements}
    assert where == {1: "old", 2: "big"}
    note = next(p.note for p in aware.placements if p.job_id == 2)
    assert note.startswith("h200 runs transformer at 2.16x its a100 speed")
    assert "a100" in aware.waits[3]
    blind = plan(q, slots, [], 10.0,
                 PlanInputs(PROFILES, TRUTH, pol))
    assert {p.job_id: p.node for p in blind.placements} == {1: "big", 2: "old"}


def test_multi_gpu_job_takes_the_faster_model():
    slots = [slot("old", 0, "a100"), slot("old", 1, "a100"),
             slot("big", 0, "h200"), slot("big", 1, "h200")]
    sp = sim_speeds(PROFILES, [("h200", 2), ("a100", 2)])
    p = plan([job(1, "resnet50", gpus=2)], slots, [], 0.0,
             PlanInputs(PROFILES, TRUTH, Policy(), speeds=sp))
    assert p.placements[0].node == "big"


def test_one_model_cluster_decides_exactly_as_without_speeds():
    """Random queues on a one-model cluster: plan() with the speed table gives the same plan
    as without it, reasons included."""
    rng = random.Random(4)
    names = sorted(PROFILES)
    sp = sim_speeds(PROFILES, [("h200", 8), ("a100", 8)])
    for trial in range(30):
        slots, active = [], []
        jid = 1
        for i in range(6):
            ids = []
            for _ in range(rng.choice([0, 0, 1, 2])):
                active.append(job(jid, rng.choice(names), node="n", idx=(i,)))
                ids.append(jid)
                jid += 1
            slots.append(GpuSlot("n", i, 140 * GIB, (140 - 12 * len(ids)) * GIB, tuple(ids), 2,
                                 gpu_model="h200"))
        q = [job(100 + k, rng.choice([*names, None]), t=float(k), gpus=rng.choice([1, 1, 2]))
             for k in range(rng.randint(1, 12))]
        a = plan(q, slots, active, 0.0,
                 PlanInputs(PROFILES, TRUTH, Policy(), speeds=sp))
        plain = [dataclasses.replace(s, gpu_model="") for s in slots]
        b = plan(q, plain, active, 0.0,
                 PlanInputs(PROFILES, TRUTH, Policy()))
        assert a == b, trial


def test_slots_carry_the_polled_model():
    inv = Inventory(nodes=(Node("a", "h1"), Node("b", "h2")))
    snap = ClusterSnapshot(0.0, (
        NodeSnapshot("a", 0.0, (GpuSample(0, "GPU-0", "NVIDIA H200", 143771.0, 0.0, 143771.0),)),
        NodeSnapshot("b", 0.0, (GpuSample(0, "GPU-1", "NVIDIA A100-SXM4-80GB", 81920.0, 0.0,
                                          81920.0),)),
    ))
    slots = {s.node: s.gpu_model for s in slots_from_snapshot(snap, [], inv, PROFILES)}
    assert slots == {"a": "h200", "b": "a100"}


def test_under_pressure_a_job_is_not_sent_where_it_loses_more_than_keep():
    """resnet18 runs at 0.69x on the a100: its comparative advantage there is larger than on
    the h200 (the queue's transformers run at 0.46x), but it would lose over 20 % for its whole
    run (placements are final), so it stays on the fastest model."""
    from iadeep_cli.scheduler.gpumodels import KEEP
    sp = sim_speeds(PROFILES, [("h200", 8), ("a100", 8)])
    f = sp.factor("resnet18", "a100")
    means = queue_means(sp, ["resnet18", "transformer", "transformer"])
    assert f < KEEP and f / means["a100"] > 1.0 / means["h200"]
    assert preference(sp, "resnet18", ["h200", "a100"], True, means) == ["h200", "a100"]

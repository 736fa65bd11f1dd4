"""Run-time adaptation, act 1: a GPU whose jobs underperform takes no new partners. It is an
input of the pure ``plan()`` (``closed``), so the simulator could use it the same way."""
from __future__ import annotations

import pytest

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, plan
from iadeep_cli.settings import Policy
from iadeep_cli.sim.truth import TruthModel

pytestmark = pytest.mark.unit
PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
GIB = 1024.0


def job(id, workload="resnet18", node=None, idx=(), **spec):
    state = JobState.RUNNING if node else JobState.QUEUED
    return Job(id, "alice", JobSpec(f"/s/{id}.sh", workload=workload, **spec), state, 0.0,
               node=node, gpu_indices=tuple(idx))


def slot(index=0, jobs=(), max_jobs=2):
    return GpuSlot("a", index, 141 * GIB, 120 * GIB, tuple(jobs), max_jobs)


def test_a_closed_gpu_takes_no_partner_and_the_wait_says_why():
    resident = job(1, "resnet50", node="a", idx=(0,))
    queue, slots = [job(2, "resnet18")], [slot(jobs=(1,))]
    opened = plan(queue, slots, [resident], 0.0,
                  PlanInputs(PROFILES, TRUTH, Policy()))
    assert [(p.job_id, p.gpu_indices) for p in opened.placements] == [(2, (0,))]
    why = "a:0 underperforms: job 1 at 0.40 (predicted 0.80, margin 0.15) for 300 s"
    closed = plan(queue, slots, [resident], 0.0,
                  PlanInputs(PROFILES, TRUTH, Policy(), closed={"a:0": why}))
    assert closed.placements == ()
    assert closed.waits[2].endswith(f"; a:0 takes no new partners: {why}")


def test_a_closed_gpu_leaves_the_others_alone():
    residents = [job(1, "resnet50", node="a", idx=(0,)), job(3, "resnet50", node="a", idx=(1,))]
    p = plan([job(2, "resnet18")], [slot(0, jobs=(1,)), slot(1, jobs=(3,))], residents, 0.0,
             PlanInputs(PROFILES, TRUTH, Policy(), closed={"a:0": "slow"}))
    assert [(p.job_id, p.gpu_indices) for p in p.placements] == [(2, (1,))]
    assert p.waits == {}


def test_a_full_closed_gpu_is_not_named():
    residents = [job(1, "resnet50", node="a", idx=(0,)), job(3, "resnet18", node="a", idx=(0,))]
    p = plan([job(2, "resnet18")], [slot(0, jobs=(1, 3))], residents, 0.0,
             PlanInputs(PROFILES, TRUTH, Policy(), closed={"a:0": "slow"}))
    assert p.placements == () and "takes no new partners" not in p.waits[2]

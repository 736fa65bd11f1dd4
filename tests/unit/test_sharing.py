"""When sharing pays: only jobs that could start now press for GPUs, run times from the lab's
history (scheduler/remaining.py), and the completion-time rule (``sharing: jct``) deciding
from the wait a job would skip against the slowdown it causes, explained in words."""
from __future__ import annotations

import math
import random

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.limits import usage_of
from iadeep_cli.scheduler.placement import GpuSlot, plan
from iadeep_cli.scheduler.remaining import Durations, LogNormal, expected_left, gittins
from iadeep_cli.scheduler.sharing import Pressure
from iadeep_cli.settings import Policy, UserLimit
from iadeep_cli.sim.truth import TruthModel

PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
GIB = 1024.0
H = 3600.0


def job(id, workload="mlp", *, node=None, idx=(), started=None, array=None, array_id=None,
        owner="alice", nodelist=(), time_limit=None):
    spec = JobSpec(f"/s/{id}.sh", workload=workload, array=array, nodelist=tuple(nodelist),
                   time_limit_s=time_limit)
    state = JobState.RUNNING if node else JobState.QUEUED
    return Job(id, owner, spec, state, 0.0, started_at=started, node=node,
               gpu_indices=tuple(idx), array_id=array_id)


def slots(n, residents=None, max_jobs=2):
    residents = residents or {}
    return [GpuSlot("a", i, 141 * GIB, 130 * GIB, tuple(residents.get(i, ())), max_jobs)
            for i in range(n)]


def where(p, job_id):
    return next(((x.node, x.gpu_indices) for x in p.placements if x.job_id == job_id), None)


# --------------------------------------------------------------------------- pressure
def _lab_with_a_resident():
    """4 GPUs, a resnet18 alone on a:0 (mlp pairs well with it: 0.74 + 1.02); three empty."""
    return [job(1, "resnet18", node="a", idx=(0,), started=0.0)], slots(4, {0: (1,)})


def test_array_tasks_beyond_their_limit_are_no_pressure():
    # Job 2 comes first; behind it, five tasks of an array limited to one at a time (its
    # task 10 already runs on a:1). They cannot start, so three empty GPUs are not scarce: job
    # 2 takes one alone instead of being packed next to the resnet18.
    active, gpus = _lab_with_a_resident()
    active.append(job(10, "mlp", node="a", idx=(1,), started=0.0, array="0-5%1", array_id=10))
    gpus = slots(4, {0: (1,), 1: (10,)})
    queue = [job(2, "mlp")] + [job(11 + k, "mlp", array="0-5%1", array_id=10) for k in range(5)]
    for sharing in ("jct", "threshold"):
        p = plan(queue, gpus, active, 100.0,
                 PlanInputs(PROFILES, TRUTH, Policy(sharing=sharing)))
        assert where(p, 2) in {("a", (2,)), ("a", (3,))}, (sharing, p)
        assert all("--array %1" in p.waits[11 + k] for k in range(5))


def test_jobs_over_their_users_limit_are_no_pressure():
    active, gpus = _lab_with_a_resident()
    queue = [job(2, "mlp")] + [job(3 + k, "mlp", owner="bob") for k in range(5)]
    limits = {"bob": UserLimit(max_jobs=0)}
    p = plan(queue, gpus, active, 100.0,
             PlanInputs(PROFILES, TRUTH, Policy(sharing="threshold"), limits))
    assert where(p, 2) in {("a", (1,)), ("a", (2,)), ("a", (3,))}
    # the same queue with bob free to run: three jobs wait behind for three empty GPUs, so
    # job 2 joins the resnet18 and leaves the empty GPUs to them (pressure as before)
    p = plan(queue, gpus, active, 100.0,
             PlanInputs(PROFILES, TRUTH, Policy(sharing="threshold")))
    assert where(p, 2) == ("a", (0,))


def test_jobs_no_gpu_here_could_take_are_no_pressure():
    active, gpus = _lab_with_a_resident()
    queue = [job(2, "mlp")] + [job(3 + k, "mlp", nodelist=("elsewhere",)) for k in range(5)]
    p = plan(queue, gpus, active, 100.0,
             PlanInputs(PROFILES, TRUTH, Policy(sharing="threshold")))
    assert where(p, 2) in {("a", (1,)), ("a", (2,)), ("a", (3,))}


# --------------------------------------------------------------------------- run times
def test_durations_learn_a_label_and_shrink_toward_the_lab():
    rng = random.Random(1)
    runs = [("long", rng.lognormvariate(math.log(8 * H), 0.5)) for _ in range(200)]
    runs += [("short", rng.lognormvariate(math.log(0.5 * H), 0.5)) for _ in range(200)]
    runs += [("rare", 20 * H)]
    d = Durations(runs)
    assert abs(d.dist("long").median_s / (8 * H) - 1) < 0.15
    assert abs(d.dist("short").median_s / (0.5 * H) - 1) < 0.15
    # one run of a label: mostly the lab-wide fit (between the two), and wider than a label
    # with many runs
    assert 0.5 * H < d.dist("rare").median_s < 20 * H
    assert d.dist("rare").sigma > d.dist("long").sigma
    # a short job is more likely to finish soon than a long one (higher index)
    assert d.index("short", None, 0.0) > 3 * d.index("long", None, 0.0)


def test_index_falls_with_age_and_rises_near_the_time_limit():
    d = LogNormal(math.log(1.5 * H), 1.3)   # heavy-tailed, like training jobs
    ages = [0.5 * H, 2 * H, 6 * H, 20 * H]
    idx = [gittins(d, None, a) for a in ages]
    assert idx == sorted(idx, reverse=True)           # run long, likely to run long yet
    assert expected_left(d, None, 20 * H) > expected_left(d, None, 0.5 * H)
    # --time 21h: a job at 20 h ends within the hour at the latest
    assert gittins(d, 21 * H, 20 * H) > 10 * gittins(d, None, 20 * H)
    assert expected_left(d, 21 * H, 20 * H) <= 1 * H


# --------------------------------------------------------------------------- sharing: jct
def _pair_round(age_h, queue_len, n_gpus=1):
    """resnet50 running ``age_h`` hours alone on a:0 (n_gpus GPUs, all busy with resnet50s
    of that age); lstm first in a queue of ``queue_len``; resnet50 + lstm together run at
    0.49 + 0.52 = 1.01, about what one alone does."""
    now = 100 * H
    active = [job(100 + i, "resnet50", node="a", idx=(i,), started=now - age_h * H)
              for i in range(n_gpus)]
    gpus = slots(n_gpus, {i: (100 + i,) for i in range(n_gpus)})
    queue = [job(1 + k, "lstm") for k in range(queue_len)]
    return plan(queue, gpus, active, now,
                PlanInputs(PROFILES, TRUTH, Policy(sharing="jct", min_speed=0.3)))


def test_jct_waits_when_the_resident_is_likely_to_end_soon_and_shares_behind_a_long_one():
    history = None   # the prior alone: how long each job has run is what differs
    del history
    young = _pair_round(age_h=0.3, queue_len=1, n_gpus=8)
    assert young.placements == ()
    why = young.waits[1]
    assert "would run it at 0.52" in why and "from 1.00 to 0.49" in why
    assert "more than the" in why and "expected to wait for a GPU" in why
    old = _pair_round(age_h=30, queue_len=1, n_gpus=1)
    assert where(old, 1) == ("a", (0,))


def test_jct_shares_more_under_a_long_queue():
    # same GPUs, same pair; the wait a job skips grows with the jobs ahead of it that wait
    few = _pair_round(age_h=2, queue_len=1, n_gpus=8)
    many = _pair_round(age_h=2, queue_len=40, n_gpus=8)
    assert len(many.placements) > len(few.placements)


def test_threshold_mode_is_the_old_rule():
    p = _pair_round(age_h=30, queue_len=1, n_gpus=1)
    assert p.placements
    now = 100 * H
    active = [job(100, "resnet50", node="a", idx=(0,), started=now - 30 * H)]
    q = plan([job(1, "lstm")], slots(1, {0: (100,)}), active, now,
             PlanInputs(PROFILES, TRUTH, Policy(sharing="threshold", min_speed=0.3)))
    assert q.placements == () and "combined speed 1.01" in q.waits[1]


def test_pressure_counts_a_users_gpus_from_the_usage_the_limits_count():
    """``Pressure`` reads the placer's ``limits.Usage`` itself: alice's two jobs sharing one
    GPU hold one of her two GPUs, so one more of her one-GPU jobs could start now (and the
    next could not); counted per job she would have none left."""
    def running(job_id: int) -> Job:
        return Job(job_id, "alice", JobSpec("/j.sh"), JobState.RUNNING, 0.0, node="n1",
                   gpu_indices=(0,))

    def queued(job_id: int) -> Job:
        return Job(job_id, "alice", JobSpec("/j.sh"), JobState.QUEUED, float(job_id))

    usage = usage_of([running(1), running(2)])
    assert {u: (len(held), jobs) for u, (held, jobs) in usage.items()} == {"alice": (1, 2)}
    bob = Job(5, "bob", JobSpec("/j.sh", gpus=2), JobState.QUEUED, 5.0)
    pressure = Pressure([queued(3), queued(4), bob], {}, usage,
                        {"alice": UserLimit(max_gpus=2)}, lambda job: True)
    assert [pressure.wants(i) for i in range(3)] == [1, 0, 2]
    assert pressure.behind(0) == 2

"""Run-time estimates, backfill on held GPUs, the held node's choice, and preemption in plan().

The run times are given as history (``Durations``), so every expectation below follows from
the numbers written here, not from the code under test.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler import placement
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, plan
from iadeep_cli.scheduler.remaining import (
    DEFAULT_RUNTIME_S,
    MIN_HISTORY,
    Durations,
    estimate_runtime,
)
from iadeep_cli.settings import Policy
from iadeep_cli.sim.engine import SimJob, make_planner, simulate
from iadeep_cli.sim.truth import TruthModel

PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
GIB = 1024.0
H = 3600.0
NOW = 100 * H


# --------------------------------------------------------------------------- the estimate
def test_with_no_history_and_no_time_limit_the_estimate_is_the_stated_default():
    est = estimate_runtime(None)
    assert est.source == "default"
    assert est.seconds == pytest.approx(DEFAULT_RUNTIME_S)
    assert est.low_s < est.seconds < est.high_s


def test_a_time_limit_caps_every_figure_of_the_estimate():
    est = estimate_runtime(None, time_limit_s=600.0)
    assert est.source == "--time"
    assert est.seconds == est.high_s == 600.0 and est.low_s <= 600.0
    # a limit far above what history says: history decides, the limit still caps
    runs = Durations([("bert", 300.0, "ann")] * 5)
    est = estimate_runtime(runs, user="ann", workload="bert", time_limit_s=10 * H)
    assert est.seconds == pytest.approx(300.0, rel=0.3) and est.high_s <= 10 * H
    assert "--time" in est.source and "history" in est.source


def test_a_user_who_asks_for_about_twice_what_they_need_is_estimated_from_their_time_limit():
    """ann's jobs run from 10 minutes to 20 hours (the label says little), but each ran about
    half its --time: her next job's estimate is about half its --time, within a narrow range.
    A job without --time, or a history without limits, is estimated as before."""
    lengths = [600.0, 2 * H, 20 * H, 1 * H, 5 * H, 3 * H]
    runs = Durations([("bert", d, "ann", 2.0 * d * (1.1 if k % 2 else 0.9))
                      for k, d in enumerate(lengths)])
    est = estimate_runtime(runs, user="ann", workload="bert", time_limit_s=8 * H)
    assert est.source == "--time x history"
    assert est.seconds == pytest.approx(4 * H, rel=0.1)
    assert 3 * H < est.low_s < est.seconds < est.high_s < 5.5 * H
    # ... and given it has already run 5 h, it is expected to run past that, within its --time
    later = estimate_runtime(runs, user="ann", workload="bert", time_limit_s=8 * H,
                             age_s=5 * H)
    assert 5 * H < later.seconds <= 8 * H and later.source == "--time x history"
    assert estimate_runtime(runs, user="ann", workload="bert").source == "user+label history"
    plain = Durations([(w, d, u) for w, d, u, _ in
                       [("bert", d, "ann", None) for d in lengths]])
    assert "x history" not in estimate_runtime(plain, user="ann", workload="bert",
                                               time_limit_s=8 * H).source


def test_the_users_runs_of_the_label_come_before_the_labels_and_the_users():
    runs = Durations([*[("bert", 600.0, "ann")] * MIN_HISTORY,      # ann's bert: 10 min
                      *[("bert", 10 * H, "bob")] * 20,               # everyone else's: 10 h
                      *[("gpt", 20 * H, "ann")] * 20])
    ann = estimate_runtime(runs, user="ann", workload="bert")
    assert ann.source == "user+label history"
    assert ann.seconds < 2 * H                 # pulled toward her 10 minutes, not the 10 h
    carl = estimate_runtime(runs, user="carl", workload="bert")
    assert carl.source == "label history" and carl.seconds > ann.seconds
    only_user = estimate_runtime(runs, user="ann", workload="resnet")
    assert only_user.source == "user history"
    nobody = estimate_runtime(runs, user="dan", workload=None)
    assert nobody.source == "lab history"


def test_a_job_that_has_run_long_is_expected_to_run_longer():
    runs = Durations([("bert", s, "ann") for s in (60.0, 600.0, 6000.0, 60000.0)])
    fresh = estimate_runtime(runs, user="ann", workload="bert")
    old = estimate_runtime(runs, user="ann", workload="bert", age_s=5 * H)
    assert old.low_s >= 5 * H and old.seconds > fresh.seconds
    assert old.left_s(5 * H) > 0
    assert all(math.isfinite(x) for x in (old.seconds, old.low_s, old.high_s))


# --------------------------------------------------------------------------- plan() helpers
def _job(i, workload="resnet18", *, owner="ann", gpus=1, submitted=0.0, node=None, idx=(),
         started=None, requeue=False, exclusive=True, limit=None):
    spec = JobSpec(f"/s/{i}.sh", workload=workload, gpus=gpus, exclusive=exclusive,
                   requeue=requeue, time_limit_s=limit)
    state = JobState.RUNNING if node else JobState.QUEUED
    return Job(i, owner, spec, state, submitted, node=node, gpu_indices=tuple(idx),
               started_at=started)


def _slot(node, index, jobs=()):
    return GpuSlot(node, index, 141 * GIB, 120 * GIB if jobs else 141 * GIB, tuple(jobs), 1)


def _plan(queue, slots, active, durations=None, policy=Policy(), attained=None):
    return plan(queue, slots, active, NOW,
                PlanInputs(PROFILES, TRUTH, policy, durations=durations, attained=attained))


# ann's resnet18 runs 10 minutes, bob's vgg16 ten hours, carol's transformer five hours
HISTORY = Durations([*[("resnet18", 600.0, "ann")] * 10, *[("vgg16", 10 * H, "bob")] * 10,
                     *[("transformer", 5 * H, "carol")] * 10])


def _held_node():
    """Node a: GPU 0 empty, GPU 1 running carol's transformer (started 1 h ago, ~4 h left);
    job 1 (2 GPUs, waiting for days) holds both."""
    slots = [_slot("a", 0), _slot("a", 1, jobs=(9,))]
    active = [_job(9, "transformer", owner="carol", node="a", idx=(1,), started=NOW - H)]
    big = _job(1, "resnet50", owner="dan", gpus=2, submitted=0.0)
    return slots, active, big


# --------------------------------------------------------------------------- backfill
def test_a_short_job_backfills_a_gpu_held_for_a_waiting_job():
    slots, active, big = _held_node()
    short = _job(2, "resnet18", owner="ann", submitted=NOW - 60)
    p = _plan([big, short], slots, active, HISTORY)
    assert [(x.job_id, x.node, x.gpu_indices) for x in p.placements] == [(2, "a", (0,))]
    assert "reserving a:0,1" in p.waits[1] and "shorter jobs may use them" in p.waits[1]


def test_a_long_job_does_not_backfill_a_gpu_held_for_a_waiting_job():
    slots, active, big = _held_node()
    long = _job(3, "vgg16", owner="bob", submitted=NOW - 60)
    p = _plan([big, long], slots, active, HISTORY)
    assert p.placements == () and 3 in p.waits


def test_a_job_nobody_knows_anything_about_does_not_backfill():
    slots, active, big = _held_node()
    unknown = _job(4, "resnet18", owner="eve", submitted=NOW - 60)
    p = _plan([big, unknown], slots, active, Durations())   # no history at all
    assert p.placements == ()
    # its --time says it ends in 10 minutes: that is enough
    timed = _job(5, "resnet18", owner="eve", submitted=NOW - 60, limit=600.0)
    p = _plan([big, timed], slots, active, Durations())
    assert [x.job_id for x in p.placements] == [5]


def test_the_held_node_is_the_one_expected_to_free_first_not_the_one_with_fewest_jobs():
    # node a: two of ann's ten-minute jobs, 5 minutes in; node b: one of bob's ten-hour jobs
    slots = [_slot("a", 0, jobs=(7,)), _slot("a", 1, jobs=(8,)), _slot("b", 0, jobs=(9,)),
             _slot("b", 1)]
    active = [_job(7, "resnet18", owner="ann", node="a", idx=(0,), started=NOW - 300),
              _job(8, "resnet18", owner="ann", node="a", idx=(1,), started=NOW - 300),
              _job(9, "vgg16", owner="bob", node="b", idx=(0,), started=NOW - 300)]
    big = _job(1, "resnet50", owner="dan", gpus=2, submitted=0.0)
    p = _plan([big], slots, active, HISTORY)
    assert "reserving a:0,1" in p.waits[1]
    # history that tells the jobs apart by nothing: every GPU is expected to free alike, and
    # the node holding fewer jobs is held (the rule before run times)
    alike = Durations([("other", 60.0, "x")] * 3)
    assert "reserving b:0,1" in _plan([big], slots, active, alike).waits[1]


# --------------------------------------------------------------------------- preemption
LAS = Policy(preemption="las")


def _las_case(requeue=True, started=NOW - H, attained_running=10 * H):
    slots = [_slot("a", 0, jobs=(9,))]
    active = [_job(9, "vgg16", owner="bob", node="a", idx=(0,), started=started,
                   requeue=requeue)]
    queued = _job(2, "resnet18", owner="ann", submitted=NOW - 60)
    return [queued], slots, active, {9: attained_running, 2: 0.0}


def test_las_preempts_a_requeueable_job_with_more_service_for_a_new_one():
    queue, slots, active, attained = _las_case()
    p = _plan(queue, slots, active, HISTORY, LAS, attained)
    assert p.preempt == (9,) and p.placements == ()
    assert p.waits[2].startswith("preempting job 9")


def test_preemption_off_never_preempts():
    queue, slots, active, attained = _las_case()
    assert _plan(queue, slots, active, HISTORY, Policy(), attained).preempt == ()


def test_a_job_that_did_not_declare_requeue_is_never_preempted():
    queue, slots, active, attained = _las_case(requeue=False)
    assert _plan(queue, slots, active, HISTORY, LAS, attained).preempt == ()


def test_a_job_with_less_service_than_the_waiting_one_is_not_preempted():
    queue, slots, active, attained = _las_case(attained_running=600.0)
    attained[2] = 2 * H          # the waiting job is the one with more service (requeued)
    assert _plan(queue, slots, active, HISTORY, LAS, attained).preempt == ()


def test_a_job_just_restarted_is_not_preempted_at_once():
    queue, slots, active, attained = _las_case(started=NOW - placement.MIN_ATTEMPT_S / 2)
    assert _plan(queue, slots, active, HISTORY, LAS, attained).preempt == ()


def test_the_gpus_a_preemption_frees_are_not_given_to_a_job_behind_in_the_same_round():
    slots = [_slot("a", 0, jobs=(9,)), _slot("a", 1)]
    active = [_job(9, "vgg16", owner="bob", node="a", idx=(0,), started=NOW - H, requeue=True)]
    big = _job(1, "resnet50", owner="dan", gpus=2, submitted=NOW - 120)
    small = _job(2, "resnet18", owner="ann", submitted=NOW - 60)
    p = _plan([big, small], slots, active, HISTORY, LAS, {9: 10 * H})
    assert p.preempt == (9,)
    assert p.placements == ()      # a:1 stays for job 1, whose room is being made


# ------------------------------------------------- the simulator's short rounds (reasons=False)
def _sim_plan(queue, slots, active, durations=None, policy=Policy(), attained=None):
    """plan() as the simulator calls it: gangs on, no wait reasons (its shortcuts on)."""
    return plan(queue, slots, active, NOW,
                PlanInputs(PROFILES, TRUTH, policy, durations=durations, attained=attained,
                           gangs=True, reasons=False))


def test_the_simulators_short_round_still_backfills_gpus_held_for_a_waiting_job():
    # node a: GPU 0 empty, GPU 1 carol's transformer; node b: its one GPU busy. Job 1 (2 GPUs)
    # holds a:0,1, so no GPU has room outside the held ones; bob's resnet18 runs 10 h (no
    # backfill), ann's 10 minutes (backfills a:0): the same workload, told apart by the owner
    runs = Durations([*[("resnet18", 600.0, "ann")] * 10, *[("resnet18", 10 * H, "bob")] * 10,
                      *[("transformer", 5 * H, "carol")] * 10, *[("vgg16", 10 * H, "bob")] * 10])
    slots = [_slot("a", 0), _slot("a", 1, jobs=(9,)), _slot("b", 0, jobs=(8,))]
    active = [_job(9, "transformer", owner="carol", node="a", idx=(1,), started=NOW - H),
              _job(8, "vgg16", owner="bob", node="b", idx=(0,), started=NOW - H)]
    big = _job(1, "resnet50", owner="dan", gpus=2, submitted=0.0)
    long = _job(2, "resnet18", owner="bob", submitted=NOW - 120)
    short = _job(3, "resnet18", owner="ann", submitted=NOW - 60)
    full = _plan([big, long, short], slots, active, runs)
    assert [(x.job_id, x.node, x.gpu_indices) for x in full.placements] == [(3, "a", (0,))]
    fast = _sim_plan([big, long, short], slots, active, runs)
    assert fast.placements == full.placements


def test_the_simulators_short_round_still_preempts_when_no_gpu_has_room():
    queue, slots, active, attained = _las_case()
    p = _sim_plan(queue, slots, active, HISTORY, LAS, attained)
    assert p.preempt == (9,)


def _gang_slots(job_ids):
    """Two nodes of two GPUs, GPU by GPU (a:0, a:1, b:0, b:1) running ``job_ids``."""
    keys = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    return [_slot(n, i, jobs=(j,)) for (n, i), j in zip(keys, job_ids)]


def test_las_preempts_a_gang_like_any_job_once_it_has_had_more_service():
    # job 9 runs on all four GPUs of two nodes (a gang), requeueable, with far more service;
    # ann's job (ten minutes) is expected to end long before bob's ten hours
    slots = _gang_slots([9, 9, 9, 9])
    active = [_job(9, "vgg16", owner="bob", gpus=4, node="a", idx=(0, 1), started=NOW - H,
                   requeue=True)]
    queued = _job(2, "resnet18", owner="ann", submitted=NOW - 60)
    p = _sim_plan([queued], slots, active, HISTORY, LAS, {9: 40 * H, 2: 0.0})
    assert p.preempt == (9,) and p.placements == ()
    # the constant off: a gang is never preempted
    placement.GANG_LAS = False
    try:
        p = _sim_plan([queued], slots, active, HISTORY, LAS, {9: 40 * H, 2: 0.0})
    finally:
        placement.GANG_LAS = True
    assert p.preempt == ()


def test_las_preempts_whole_nodes_for_a_gang_and_a_gang_starts_on_whole_empty_nodes():
    slots = _gang_slots([5, 6, 7, 8])
    active = [_job(j, "vgg16", owner="bob", node=n, idx=(i,), started=NOW - H, requeue=True)
              for j, (n, i) in zip((5, 6, 7, 8), [("a", 0), ("a", 1), ("b", 0), ("b", 1)])]
    gang = _job(1, "resnet50", owner="dan", gpus=4, submitted=NOW - 60)
    attained = {5: 10 * H, 6: 10 * H, 7: 10 * H, 8: 10 * H, 1: 0.0}
    p = _sim_plan([gang], slots, active, HISTORY, LAS, attained)
    assert p.preempt == (5, 6, 7, 8) and p.placements == ()
    # one job that may not be requeued keeps its node: too few whole nodes, nothing preempted
    stays = [replace(active[3], spec=replace(active[3].spec, requeue=False)), *active[:3]]
    assert _sim_plan([gang], slots, stays, HISTORY, LAS, attained).preempt == ()
    empty = [_slot(n, i) for n in "ab" for i in (0, 1)]
    p = _sim_plan([gang], empty, [], HISTORY, LAS, {1: 0.0})
    assert [(x.node, x.gpu_indices, x.gang) for x in p.placements] == \
        [("a", (0, 1), (("b", (0, 1)),))]


def test_las_does_not_preempt_a_job_expected_to_end_before_the_waiting_one():
    # the running job (bob's vgg16, ten hours, 9 h in, more service) is expected to end
    # within the hour; bob's new vgg16 would run ten hours: preempting would not pay
    slots = [_slot("a", 0, jobs=(9,))]
    active = [_job(9, "vgg16", owner="bob", node="a", idx=(0,), started=NOW - 9 * H,
                   requeue=True)]
    long = _job(2, "vgg16", owner="bob", submitted=NOW - 60)
    p = _plan([long], slots, active, HISTORY, LAS, {9: 9 * H, 2: 0.0})
    assert p.preempt == ()
    # ann's ten minutes would end first: preempted for her
    short = _job(3, "resnet18", owner="ann", submitted=NOW - 60)
    assert _plan([short], slots, active, HISTORY, LAS, {9: 9 * H, 3: 0.0}).preempt == (9,)
    # nothing known of the waiting job: least attained service's bet that it is short stands
    assert _plan([long], slots, active, Durations(), LAS, {9: 9 * H, 2: 0.0}).preempt == (9,)


# --------------------------------------------------------------------------- in the engine
def _sim(requeue: bool, policy: Policy):
    jobs = [SimJob(1, 0.0, "vgg16", 10 * H, requeue=requeue),
            SimJob(2, 2 * H, "mlp", 0.5 * H, requeue=requeue)]
    mem = {j.id: 0.0 for j in jobs}
    return simulate(jobs, make_planner("iadeep", PROFILES, TRUTH, TRUTH, policy, mem, 0),
                    TRUTH, gpus=1, profiles=PROFILES, name="iadeep", policy=policy,
                    preempt_cost_s=90.0)


def test_iadeep_with_las_preempts_only_jobs_that_declared_requeue_in_the_simulator():
    policy = Policy(preemption="las", max_jobs_per_gpu=1)
    every = _sim(True, policy)
    assert every.preemptions == 1
    assert every.jcts == pytest.approx((10.5 * H + 90.0, 0.5 * H))
    assert every.preempt_cost_gpu_h == pytest.approx(90.0 / H)
    none = _sim(False, policy)
    assert none.preemptions == 0 and none.jcts == pytest.approx((10 * H, 8.5 * H))


def test_requeueable_marks_that_fraction_of_the_jobs_and_refuses_a_bad_one():
    from iadeep_cli.errors import InputError
    from iadeep_cli.sim.run import mark_requeueable

    jobs = [SimJob(i, float(i), "mlp", 60.0) for i in range(1, 41)]
    half = mark_requeueable(jobs, 0.5, seed=3)
    assert sum(j.requeue for j in half) == 20
    assert [(j.id, j.submit_s, j.duration_s) for j in half] == \
        [(j.id, j.submit_s, j.duration_s) for j in jobs]        # the trace itself unchanged
    assert all(j.requeue for j in mark_requeueable(jobs, 1.0, seed=3))
    assert not any(j.requeue for j in mark_requeueable(jobs, 0.0, seed=3))
    with pytest.raises(InputError, match="--requeueable"):
        mark_requeueable(jobs, 1.5, seed=3)


# --------------------------------------------------------------------------- gangs hold nodes
def _gang_plan(queue, slots, active, policy=Policy(), attained=None, durations=HISTORY):
    """The full round (every wait reason) with gangs on, as the simulator replays a trace."""
    return plan(queue, slots, active, NOW,
                PlanInputs(PROFILES, TRUTH, policy, durations=durations, attained=attained,
                           gangs=True))


def _three_nodes():
    """Nodes a, b, c of two GPUs: a runs two of bob's ten-hour jobs, b two of ann's
    ten-minute jobs (5 minutes in), c one of carol's five-hour jobs (1 h in) beside an empty
    GPU. A gang of four GPUs has waited for days."""
    slots = [_slot("a", 0, jobs=(5,)), _slot("a", 1, jobs=(6,)), _slot("b", 0, jobs=(7,)),
             _slot("b", 1, jobs=(8,)), _slot("c", 0, jobs=(9,)), _slot("c", 1)]
    active = [_job(5, "vgg16", owner="bob", node="a", idx=(0,), started=NOW - 300),
              _job(6, "vgg16", owner="bob", node="a", idx=(1,), started=NOW - 300),
              _job(7, "resnet18", owner="ann", node="b", idx=(0,), started=NOW - 300),
              _job(8, "resnet18", owner="ann", node="b", idx=(1,), started=NOW - 300),
              _job(9, "transformer", owner="carol", node="c", idx=(0,), started=NOW - H)]
    gang = _job(1, "resnet50", owner="dan", gpus=4, submitted=0.0)
    return slots, active, gang


def test_a_waiting_gang_holds_the_whole_nodes_expected_to_empty_first():
    slots, active, gang = _three_nodes()
    p = _gang_plan([gang], slots, active)
    # b empties in ~5 minutes, c in ~4 hours, a in ~10 hours: b and c are held, not a
    assert p.placements == ()
    assert re.search(r"reserving nodes b, c while they drain, expected free in [34]h\d\dm",
                     p.waits[1])


def test_a_long_job_does_not_take_a_node_held_for_a_gang_and_a_short_one_may():
    slots, active, gang = _three_nodes()
    long = _job(2, "vgg16", owner="bob", submitted=NOW - 60)
    short = _job(3, "resnet18", owner="ann", submitted=NOW - 30)
    p = _gang_plan([gang, long, short], slots, active)
    # c:1 is empty but held: bob's ten hours would keep the gang waiting, ann's ten minutes not
    assert [(x.job_id, x.node, x.gpu_indices) for x in p.placements] == [(3, "c", (1,))]
    assert 2 in p.waits
    # without the gang waiting, bob's job takes the empty GPU
    p = _gang_plan([long], slots, active)
    assert [(x.job_id, x.node) for x in p.placements] == [(2, "c")]


def test_a_gang_holds_nodes_only_after_waiting_the_reservation_delay():
    slots, active, _ = _three_nodes()
    recent = _job(1, "resnet50", owner="dan", gpus=4, submitted=NOW - 60)
    long = _job(2, "vgg16", owner="bob", submitted=NOW - 30)
    p = _gang_plan([recent, long], slots, active)
    assert "will reserve whole nodes in 59m" in p.waits[1]
    assert [(x.job_id, x.node) for x in p.placements] == [(2, "c")]


def test_under_las_with_every_job_requeueable_a_gang_preempts_instead_of_holding():
    # jobs ranked after the gang (it was submitted first) on whole nodes are preempted for it,
    # the cheapest nodes first, but not ann's jobs, which end within minutes: nodes a and c
    slots, active, gang = _three_nodes()
    active = [replace(j, spec=replace(j.spec, requeue=True)) for j in active]
    attained = {j.id: 600.0 for j in active} | {1: 0.0}
    p = _gang_plan([gang], slots, active, LAS, attained)
    assert p.preempt == (5, 6, 9) and p.placements == ()
    assert p.waits[1].startswith("preempting jobs 5, 6, 9") and "reserving" not in p.waits[1]


def test_a_gang_holds_no_nodes_without_run_times_to_backfill_them_by():
    # plan() given no durations (the simulator's 'exclusive'): nobody could backfill the
    # held nodes, so the gang holds none and a long job takes the empty GPU
    slots, active, gang = _three_nodes()
    long = _job(2, "vgg16", owner="bob", submitted=NOW - 60)
    p = _gang_plan([gang, long], slots, active, durations=None)
    assert "reserving" not in p.waits[1]
    assert [(x.job_id, x.node) for x in p.placements] == [(2, "c")]


def test_a_gang_holds_nothing_when_too_few_nodes_could_ever_take_it():
    slots, active, _ = _three_nodes()
    huge = _job(1, "resnet50", owner="dan", gpus=8, submitted=0.0)   # 6 GPUs in all
    long = _job(2, "vgg16", owner="bob", submitted=NOW - 60)
    p = _gang_plan([huge, long], slots, active)
    assert "reserving" not in p.waits[1]
    assert [(x.job_id, x.node) for x in p.placements] == [(2, "c")]


def test_a_gang_behind_a_stream_of_small_jobs_starts_once_its_held_nodes_drain():
    # two nodes of two GPUs; one-GPU jobs of 2 h arrive every 30 minutes for two days, so
    # the nodes are never both empty by chance; the gang arrives at 1 h and holds them
    # after an hour's wait: it starts once their jobs end, not after the stream
    stream = [SimJob(i, (i - 1) * 0.5 * H, "resnet18", 2 * H) for i in range(1, 97)]
    gang = SimJob(200, 1 * H, "vgg16", H, gpus=4)
    jobs = [*stream, gang]
    policy = Policy(max_jobs_per_gpu=1)
    mem = {j.id: 0.0 for j in jobs}
    r = simulate(jobs, make_planner("iadeep", PROFILES, TRUTH, TRUTH, policy, mem, 0),
                 TRUTH, gpus=4, gpus_per_node=2, profiles=PROFILES, name="iadeep",
                 policy=policy)
    jct = dict(zip(sorted(j.id for j in jobs), r.jcts))
    # an hour before it may hold, at most 2 h for the held nodes to drain, its own hour
    assert jct[200] <= 4 * H + 1.0

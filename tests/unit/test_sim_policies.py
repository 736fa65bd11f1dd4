"""The simulator's peers (Tiresias, Gandiva, Lucid), iadeep's caution, leave-one-workload-out,
the impact factor and the multi-seed statistics: each rule checked on a case it decides."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.model.predictor import fit_model
from iadeep_cli.scheduler.placement import GpuSlot
from iadeep_cli.scheduler.prediction import CautiousModel
from iadeep_cli.settings import Policy
from iadeep_cli.sim.engine import H200_MIB, PolicyResult, SimJob, simulate
from iadeep_cli.sim.policies import (
    TIRESIAS_Q1_GPU_S,
    lucid_score,
    make_planner,
    mean_ci,
    t95,
    tiresias_queue,
)
from iadeep_cli.sim.run import (
    HeldOutModel,
    SimReport,
    SimSettings,
    parse_sweep,
    run_seeds,
    summarize,
    winners,
)
from iadeep_cli.sim.truth import TruthModel

PROFILES = shipped_profiles()
PAIRS = shipped_pairs()
TRUTH = TruthModel(PAIRS, shipped_triples())
IADEEP = [str(Path(sys.executable).parent / "iadeep")]
H = 3600.0


def cli(*args):
    return subprocess.run(IADEEP + list(args), capture_output=True, text=True, timeout=300)


def _job(i, workload, state=JobState.QUEUED, node=None, gpus=(), submitted=0.0, started=None):
    return Job(i, "sim", JobSpec("sim", workload=workload), state, submitted, node=node,
               gpu_indices=gpus, started_at=started)


def _slots(residents: dict[int, list[Job]], n: int):
    """n GPUs on node n0; ``residents``: gpu index -> running jobs."""
    out = []
    for i in range(n):
        jobs = residents.get(i, [])
        used = sum((PROFILES[j.spec.workload].peak_mem_gib + 2.0) * 1024 for j in jobs)
        out.append(GpuSlot("n0", i, H200_MIB, H200_MIB - used, tuple(j.id for j in jobs), 2))
    return tuple(out)


def _planner(name, ids):
    mem = dict.fromkeys(ids, (1.0 + 2.0) * 1024)
    return make_planner(name, PROFILES, TRUTH, TRUTH, Policy(), mem, 0)


def _running(i, workload, gpu, started=0.0):
    return _job(i, workload, JobState.RUNNING, "n0", (gpu,), started=started)


# --------------------------------------------------------------------------- Lucid
def test_lucid_scores_follow_utilisation_and_memory():
    assert lucid_score(PROFILES["mlp"], H200_MIB) == 0          # 11 % busy, tiny memory
    assert lucid_score(PROFILES["resnet18"], H200_MIB) == 1     # 43 %
    assert lucid_score(PROFILES["vgg16"], H200_MIB) == 2        # 97 %
    big = replace(PROFILES["mlp"], peak_mem_gib=0.6 * H200_MIB / 1024)
    assert lucid_score(big, H200_MIB) == 2                       # memory alone makes it jumbo
    mid = replace(PROFILES["mlp"], peak_mem_gib=0.3 * H200_MIB / 1024)
    assert lucid_score(mid, H200_MIB) == 1


def test_lucid_pairs_only_compatible_scores_and_the_earliest_partner():
    # GPU0: vgg16 (jumbo), GPU1: mlp (tiny, started later), GPU2: mlp (tiny, started first)
    active = [_running(1, "vgg16", 0), _running(2, "mlp", 1, started=50.0),
              _running(3, "mlp", 2, started=10.0)]
    slots = _slots({0: [active[0]], 1: [active[1]], 2: [active[2]]}, 3)
    queue = [_job(10, "resnet18", submitted=1.0), _job(11, "resnet18", submitted=2.0),
             _job(12, "vgg16", submitted=3.0)]
    plan = _planner("lucid", [1, 2, 3, 10, 11, 12])(queue, slots, active, 100.0)
    where = {p.job_id: p.gpu_indices[0] for p in plan.placements}
    assert where[10] == 2          # medium + tiny; the partner that started first
    assert where[11] == 1          # the next tiny one; never the jumbo vgg16 (1 + 2 > 2)
    assert 12 not in where         # jumbo + medium/jumbo: no partner left, no empty GPU


def test_lucid_does_not_share_without_pressure():
    active = [_running(1, "mlp", 0)]
    slots = _slots({0: [active[0]]}, 2)
    plan = _planner("lucid", [1, 10])([_job(10, "resnet18")], slots, active, 0.0)
    assert [(p.job_id, p.gpu_indices) for p in plan.placements] == [(10, (1,))]


# --------------------------------------------------------------------------- Gandiva
def test_gandiva_takes_an_empty_gpu_then_the_lowest_summed_utilisation():
    active = [_running(1, "vgg16", 0), _running(2, "resnet18", 1)]
    slots = _slots({0: [active[0]], 1: [active[1]]}, 3)
    queue = [_job(10, "vgg16", submitted=1.0), _job(11, "vgg16", submitted=2.0),
             _job(12, "transformer", submitted=3.0)]
    plan = _planner("gandiva", [1, 2, 10, 11, 12])(queue, slots, active, 0.0)
    where = {p.job_id: p.gpu_indices[0] for p in plan.placements}
    assert where[10] == 2          # the empty GPU first
    assert where[11] == 1          # 43 % (resnet18) < 97 % (vgg16), whatever the interference
    assert where[12] == 0          # GPU0 97 % < GPU1 43 + 97 %; GPU2 is as busy as GPU0 but
    #                                both 97: the tie goes to the lower key


# --------------------------------------------------------------------------- Tiresias
def test_tiresias_queue_threshold():
    assert tiresias_queue(0.0) == 0
    assert tiresias_queue(TIRESIAS_Q1_GPU_S - 1) == 0
    assert tiresias_queue(TIRESIAS_Q1_GPU_S) == 1


def test_tiresias_preempts_a_job_past_the_first_queue_for_a_new_one():
    planner = _planner("tiresias", [1, 2])
    running = [_running(1, "vgg16", 0)]
    slots = _slots({0: running}, 1)
    planner.view.attained[1] = 0.5 * TIRESIAS_Q1_GPU_S
    plan = planner([_job(2, "mlp", submitted=5.0)], slots, running, 10.0)
    assert plan.placements == () and plan.preempt == ()      # both in queue 1: FIFO
    planner.view.attained[1] = 2 * TIRESIAS_Q1_GPU_S
    plan = planner([_job(2, "mlp", submitted=5.0)], slots, running, 10.0)
    assert plan.preempt == (1,)
    assert [(p.job_id, p.gpu_indices) for p in plan.placements] == [(2, (0,))]


def test_tiresias_ranks_a_queue_given_out_of_order_by_queue_then_submission():
    """The queue arrives in any order; queue 0 (less than the limit attained) goes first, each
    queue by submission: of four waiting jobs for two free GPUs, the two in queue 0 start, the
    earlier-submitted first, though a queue-1 job was submitted before both."""
    planner = _planner("tiresias", [1, 2, 3, 4])
    planner.view.attained.update({1: 2 * TIRESIAS_Q1_GPU_S, 4: 0.5 * TIRESIAS_Q1_GPU_S})
    queue = [_job(3, "mlp", submitted=30.0), _job(2, "mlp", submitted=20.0),
             _job(1, "mlp", submitted=1.0), _job(4, "mlp", submitted=40.0)]
    plan = planner(queue, _slots({}, 2), [], 50.0)
    assert [p.job_id for p in plan.placements] == [2, 3]
    plan = planner(queue, _slots({}, 3), [], 50.0)
    assert [p.job_id for p in plan.placements] == [2, 3, 4]
    plan = planner(queue, _slots({}, 4), [], 50.0)
    assert [p.job_id for p in plan.placements] == [2, 3, 4, 1]


def test_tiresias_in_the_engine_resumes_the_preempted_job_with_its_work_left():
    jobs = [SimJob(1, 0.0, "vgg16", 10 * H), SimJob(2, 2 * H, "mlp", 0.5 * H)]
    mem = {j.id: 0.0 for j in jobs}
    r = simulate(jobs, make_planner("tiresias", PROFILES, TRUTH, TRUTH, Policy(), mem, 0),
                 TRUTH, gpus=1, profiles=PROFILES, name="tiresias", preempt_cost_s=0.0)
    assert r.jcts == pytest.approx((10.5 * H, 0.5 * H))   # job 2 jumps in; job 1 loses nothing
    assert r.preemptions == 1 and r.impact == pytest.approx(1.0)
    assert r.preempt_cost_gpu_h == 0.0
    e = simulate(jobs, make_planner("exclusive", PROFILES, TRUTH, TRUTH, Policy(), mem, 0),
                 TRUTH, gpus=1, profiles=PROFILES, name="exclusive")
    assert e.jcts == pytest.approx((10 * H, 8.5 * H)) and e.preemptions == 0


def test_a_preemption_costs_the_preempted_job_its_checkpoint_and_restart():
    jobs = [SimJob(1, 0.0, "vgg16", 10 * H), SimJob(2, 2 * H, "mlp", 0.5 * H)]
    mem = {j.id: 0.0 for j in jobs}
    r = simulate(jobs, make_planner("tiresias", PROFILES, TRUTH, TRUTH, Policy(), mem, 0),
                 TRUTH, gpus=1, profiles=PROFILES, name="tiresias", preempt_cost_s=600.0)
    assert r.jcts == pytest.approx((10.5 * H + 600.0, 0.5 * H))   # its work + 10 min again
    assert r.preempt_cost_gpu_h == pytest.approx(600.0 / H)
    # its queue wait counts the half hour it spent preempted, not only the wait to start
    assert r.avg_wait_s == pytest.approx((0.5 * H + 0.0) / 2)


def test_tiresias_replans_when_a_job_crosses_its_queue_limit_not_only_at_events():
    # job 2 arrives while job 1 is still in queue 1's first hour: FIFO, it waits; once job 1
    # crosses the limit (at 1 h, no arrival or end then) Tiresias preempts it for job 2
    jobs = [SimJob(1, 0.0, "vgg16", 10 * H), SimJob(2, 0.5 * H, "mlp", 0.5 * H)]
    mem = {j.id: 0.0 for j in jobs}
    r = simulate(jobs, make_planner("tiresias", PROFILES, TRUTH, TRUTH, Policy(), mem, 0),
                 TRUTH, gpus=1, profiles=PROFILES, name="tiresias", preempt_cost_s=0.0)
    assert r.preemptions == 1
    assert r.jcts[1] == pytest.approx(1.0 * H)   # waited from 0.5 h to 1 h, ran 0.5 h


# --------------------------------------------------------------------------- impact factor
def test_impact_factor_is_work_over_busy_gpu_time():
    s1, s2 = TRUTH.speeds(["mlp", "resnet18"])
    jobs = [SimJob(1, 0.0, "mlp", H), SimJob(2, 0.0, "resnet18", H)]
    mem = {j.id: 0.0 for j in jobs}
    r = simulate(jobs, make_planner("packing", PROFILES, TRUTH, TRUTH, Policy(), mem, 0),
                 TRUTH, gpus=1, profiles=PROFILES, name="packing")
    fast, slow = max(s1, s2), min(s1, s2)
    busy = H / fast + (H - slow * H / fast)     # both share, then the slower one runs alone
    assert r.impact == pytest.approx(2 * H / busy)
    assert r.impact > 1.5                       # a pair that shares well nearly doubles it
    alone = simulate(jobs, make_planner("exclusive", PROFILES, TRUTH, TRUTH, Policy(), mem, 0),
                     TRUTH, gpus=1, profiles=PROFILES, name="exclusive")
    assert alone.impact == pytest.approx(1.0)


# --------------------------------------------------------------------------- iadeep's caution
def test_cautious_model_lowers_unsure_speeds_more_than_measured_ones():
    full = fit_model(PROFILES, PAIRS)
    held = HeldOutModel(PROFILES, PAIRS)
    a, b = PROFILES["resnet18"], PROFILES["vgg16"]
    for model in (full, held):
        point = model.predict_group([a, b])
        cautious = CautiousModel(model).predict_group([a, b])
        assert all(c <= p for c, p in zip(cautious, point))
    drop_measured = full.predict_group([a, b])[0] - CautiousModel(full).predict_group([a, b])[0]
    drop_unseen = held.predict_group([a, b])[0] - CautiousModel(held).predict_group([a, b])[0]
    assert drop_unseen > drop_measured > 0
    assert CautiousModel(TRUTH).predict_group([a, b]) == TRUTH.predict_group([a, b])


def test_held_out_model_never_saw_the_jobs_workload():
    held = HeldOutModel(PROFILES, PAIRS)
    assert set(held.models) == set(PROFILES)
    for w, model in held.models.items():
        assert not any(w in key for key in model.observed)
        assert w not in model.trained_on
    # an observed pair is reproduced by the full model, not by the held-out one
    full = fit_model(PROFILES, PAIRS)
    pair = next(p for p in PAIRS if p.jobs == ("resnet18", "mlp"))
    got_full = full.predict_group([PROFILES["resnet18"], PROFILES["mlp"]])
    got_held = held.predict_group([PROFILES["resnet18"], PROFILES["mlp"]])
    assert got_full == pytest.approx(pair.speeds, abs=0.03)
    assert got_held != pytest.approx(pair.speeds, abs=0.03)


# --------------------------------------------------------------------------- statistics
def test_mean_ci_is_the_student_t_interval():
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == pytest.approx(2.0) and h == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert mean_ci([0.7]) == (0.7, 0.0)
    assert t95(9) == pytest.approx(2.262) and t95(200) == pytest.approx(1.96)


def _rep(**avg):
    res = tuple(PolicyResult(n, v, 2 * v, 10 * v, 0.9, 0.0, 0.0, impact=1.0 + v / 100)
                for n, v in avg.items())
    return SimReport(SimSettings(), res, "", 10)


def test_wins_skip_reference_policies_and_count_ties():
    assert winners(_rep(exclusive=10, iadeep=6, oracle=5, lucid=7)) == {"iadeep"}
    assert winners(_rep(exclusive=10, iadeep=6, gandiva=6)) == {"iadeep", "gandiva"}


def test_summary_ratios_are_per_seed_then_averaged():
    runs = [_rep(exclusive=10, iadeep=5, lucid=6), _rep(exclusive=20, iadeep=16, lucid=12)]
    stats = {p.name: p for p in summarize(runs)}
    assert stats["iadeep"].ratio == pytest.approx((0.5 + 0.8) / 2)
    assert stats["lucid"].ratio == pytest.approx((0.6 + 0.6) / 2)
    assert stats["lucid"].ratio_ci == pytest.approx(0.0)
    assert stats["iadeep"].ratio_ci == pytest.approx(12.706 * math.sqrt(0.045) / math.sqrt(2))
    assert (stats["iadeep"].wins, stats["lucid"].wins, stats["exclusive"].wins) == (1, 1, 0)
    assert stats["iadeep"].p95_h == pytest.approx((10 + 32) / 2 / 3600)
    assert stats["iadeep"].impact == pytest.approx(1 + (5 + 16) / 2 / 100)


def test_run_seeds_uses_one_trace_per_seed():
    rep = run_seeds(SimSettings(jobs=30, policies=("exclusive", "packing")), 3)
    assert rep.seeds == (0, 1, 2)
    jcts = {r.results[0].avg_jct_s for r in rep.runs}
    assert len(jcts) == 3
    assert rep.stat("exclusive").ratio == 1.0 and 0 < rep.bound_ratio < 1


def test_parse_sweep_and_its_errors():
    assert parse_sweep("load=0.6,0.9") == ("load", (0.6, 0.9))
    assert parse_sweep("gpus=8,16") == ("gpus", (8.0, 16.0))
    from iadeep_cli.errors import InputError
    for bad in ("speed=1,2", "load", "load=a,b", "gpus=8.5", "load=-1"):
        with pytest.raises(InputError):
            parse_sweep(bad)


# --------------------------------------------------------------------------- CLI
def test_cli_seeds_json_and_sweep_tables():
    out = cli("sim", "--jobs", "30", "--seeds", "2", "--policies", "exclusive,lucid,iadeep",
              "--json")
    assert out.returncode == 0, out.stderr
    table = json.loads(out.stdout)["tables"][0]
    assert table["seeds"] == [0, 1]
    assert set(table["policies"]) == {"exclusive", "lucid", "iadeep"}
    assert table["policies"]["exclusive"]["ratio"] == 1.0
    out = cli("sim", "--jobs", "30", "--seeds", "2", "--policies", "exclusive,gandiva",
              "--sweep", "load=0.9,1.5")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("avg JCT vs excl (95% CI)") == 2
    assert "load 0.9:" in out.stdout and "load 1.5:" in out.stdout


def test_cli_seed_errors_are_one_line():
    for args, word in ((("--seeds", "0"), "--seeds"), (("--sweep", "speed=1"), "--sweep"),
                       (("--seeds", "2", "--policies", "iadeep"), "exclusive"),
                       (("--lowo", "--model", "m.json"), "--lowo")):
        out = cli("sim", "--jobs", "10", *args)
        assert out.returncode != 0 and "Traceback" not in out.stderr
        assert out.stderr.strip().splitlines()[0].startswith("Error:") and word in out.stderr


def test_cli_plot_of_a_sweep(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    out = cli("sim", "--jobs", "20", "--seeds", "2", "--policies", "exclusive,iadeep",
              "--sweep", "gpus=4,8", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["exclusive", "packing", "random", "tiresias", "gandiva",
                                  "lucid", "oracle"])
def test_every_default_planner_plans_the_same_from_a_ranked_queue_as_from_a_list(name):
    """The engine hands its planners the queue kept ranked (``RankedQueue``); a list of the
    same jobs in another order must give the same plan: a crowded node, one- and two-GPU jobs,
    some old enough to reserve, one back from preemption with attained service."""
    import random as rnd

    from iadeep_cli.scheduler.priority import RankedQueue
    rng = rnd.Random(3)
    names = sorted(PROFILES)
    running = [_running(100 + g, rng.choice(names), g) for g in range(6)]
    queue = [Job(i, "sim", JobSpec("sim", workload=rng.choice(names), gpus=rng.choice([1, 1, 2])),
                 JobState.QUEUED, float(rng.randrange(0, 40000))) for i in range(1, 120)]
    shuffled = list(reversed(queue))
    residents = {g: [j] for g, j in enumerate(running)}
    plans = []
    for q in (RankedQueue(queue), shuffled):
        planner = _planner(name, [j.id for j in queue + running])
        planner.view.attained.update({5: 7200.0, 100: 500.0, 101: 9000.0})
        plans.append(planner(q, _slots(residents, 8), running, 50000.0, None))
    assert plans[0].placements == plans[1].placements
    assert plans[0].preempt == plans[1].preempt
    assert plans[0].placements or plans[0].preempt   # the round decided something

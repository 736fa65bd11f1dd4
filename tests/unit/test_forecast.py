"""The forecast engine (scheduler/forecast.py) on scenarios whose answer is known by hand.

The real plan(), the measured H200 truth as the predictor (its speeds come from the shipped
CSVs), run-time estimates from ``estimate_runtime``. Each expected figure below is worked out
from the scenario: a job with ``--time`` shorter than the default estimate (an hour) runs
exactly its ``--time``.
"""
from __future__ import annotations

import pytest

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler import forecast as fc
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, spec_memory_mib
from iadeep_cli.scheduler.remaining import DEFAULT_RUNTIME_S
from iadeep_cli.settings import Policy
from iadeep_cli.sim.truth import TruthModel

PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
POLICY = Policy()
GIB = 1024.0
NOW = 100_000.0


def running(id, *, workload=None, time_s=None, started=NOW, node="a", idx=(0,)):
    spec = JobSpec(f"/s/{id}.sh", workload=workload, time_limit_s=time_s, gpus=len(idx))
    return Job(id, "alice", spec, JobState.RUNNING, started - 10, node=node,
               gpu_indices=tuple(idx), started_at=started)


def queued(id, *, workload=None, time_s=None, gpus=1, t=NOW - 50, owner="bob", mem=None):
    spec = JobSpec(f"/s/{id}.sh", workload=workload, time_limit_s=time_s, gpus=gpus,
                   mem_gib=mem)
    return Job(id, owner, spec, JobState.QUEUED, t)


def slot(index=0, jobs=(), node="a", free_gib=140.0, max_jobs=2):
    return GpuSlot(node, index, 141 * GIB, free_gib * GIB, tuple(jobs), max_jobs)


def forecast(queue, slots, active=(), progress=None, policy=POLICY):
    return fc.forecast(queue, slots, list(active), now=NOW,
                       decide=fc.planner(PlanInputs(PROFILES, TRUTH, policy)),
                       left=fc.lefts_of(None, NOW, progress), runtime=fc.runtimes_of(None),
                       group_speed=fc.speeds_of(PROFILES, TRUTH),
                       memory=lambda j: spec_memory_mib(j.spec, PROFILES, policy))


def test_the_next_job_on_a_busy_gpu_is_expected_to_start_when_the_running_job_reaches_its_time():
    # job 1 has run 10 minutes of its 30-minute --time: it ends in 20 minutes
    got = forecast([queued(2, time_s=1800)], [slot(jobs=(1,))],
                   [running(1, time_s=1800, started=NOW - 600)])
    assert got.jobs[1].end == pytest.approx(NOW + 1200)
    two = got.jobs[2]
    assert two.start == pytest.approx(NOW + 1200)
    assert (two.node, two.gpus, two.beside) == ("a", (0,), ())
    assert two.end == pytest.approx(NOW + 1200 + 1800)
    assert two.source == "--time"


def test_a_job_with_a_free_gpu_is_expected_to_start_now_with_no_spread():
    got = forecast([queued(2, time_s=600)], [slot(0, jobs=(1,)), slot(1)],
                   [running(1, time_s=1800)])
    two = got.jobs[2]
    assert (two.start, two.start_low, two.start_high) == (NOW, NOW, NOW)
    assert two.gpus == (1,)
    assert two.end == pytest.approx(NOW + 600)


def test_jobs_queue_one_behind_the_other_each_starting_at_the_end_of_the_one_before():
    got = forecast([queued(2, time_s=1200, t=NOW - 90), queued(3, time_s=900, t=NOW - 80)],
                   [slot(jobs=(1,))], [running(1, time_s=600)])
    assert got.jobs[2].start == pytest.approx(NOW + 600)
    assert got.jobs[3].start == pytest.approx(NOW + 600 + 1200)
    assert got.jobs[3].end == pytest.approx(NOW + 600 + 1200 + 900)


def test_a_job_without_a_time_limit_or_history_runs_the_stated_default():
    got = forecast([queued(2)], [slot(jobs=(1,))], [running(1, time_s=600)])
    two = got.jobs[2]
    assert two.source == "default"
    assert two.end - two.start == pytest.approx(DEFAULT_RUNTIME_S)
    # the range around the default: its spread is broad, the low end well before the median
    assert two.end_low < two.end < two.end_high


def test_a_running_jobs_progress_gives_its_end_over_its_time_limit():
    # by its --time it could run another 50 minutes; by its progress it has 5 minutes left
    got = forecast([queued(2, time_s=600)], [slot(jobs=(1,))],
                   [running(1, time_s=3600, started=NOW - 600)], progress={1: 300.0})
    assert got.jobs[1].end == pytest.approx(NOW + 300)
    assert got.jobs[2].start == pytest.approx(NOW + 300)
    assert got.jobs[2].start_low <= NOW + 300 <= got.jobs[2].start_high


def test_a_range_around_a_default_estimate_brackets_the_expected_start():
    # job 1 has no --time and no history: its end is uncertain, and so is job 2's start
    got = forecast([queued(2, time_s=600)], [slot(jobs=(1,))], [running(1)])
    two = got.jobs[2]
    assert two.start_low < two.start < two.start_high
    assert two.start == pytest.approx(NOW + DEFAULT_RUNTIME_S)


def test_a_job_that_shares_is_expected_beside_its_partner_at_the_predicted_speed():
    # two GPUs, both busy with a resnet18; two jobs waiting: they share (the policy puts a
    # profiled job beside a profiled one when both gain), at the truth's measured speeds
    active = [running(1, workload="resnet18", time_s=7200, idx=(0,)),
              running(3, workload="resnet18", time_s=7200, idx=(1,))]
    queue = [queued(2, workload="resnet18", time_s=3600, t=NOW - 90),
             queued(4, workload="resnet18", time_s=3600, t=NOW - 80),
             queued(5, workload="resnet18", time_s=3600, t=NOW - 70)]
    got = forecast(queue, [slot(0, jobs=(1,)), slot(1, jobs=(3,))], active)
    two = got.jobs[2]
    speed = TRUTH.speeds(["resnet18", "resnet18"])[0]
    assert speed < 1.0
    assert two.start == NOW and two.beside in ((1,), (3,))
    assert two.speed == pytest.approx(speed, rel=1e-6)
    # sharing slows it: its hour of work takes an hour / speed while it shares
    assert two.end - two.start == pytest.approx(3600 / speed, rel=0.05)


def test_a_job_too_big_for_every_gpu_has_no_forecast_start():
    got = forecast([queued(2, mem=500, time_s=600)], [slot(jobs=(1,))], [running(1, time_s=60)])
    assert got.jobs[2].start is None and got.jobs[2].end is None


def test_a_forecast_stops_at_its_step_limit_and_says_so():
    queue = [queued(i, time_s=600, t=NOW - 1000 + i) for i in range(2, 12)]
    got = fc.forecast(queue, [slot(jobs=(1,))], [running(1, time_s=600)], now=NOW,
                      decide=fc.planner(PlanInputs(PROFILES, TRUTH, POLICY)),
                      left=fc.lefts_of(None, NOW),
                      runtime=fc.runtimes_of(None), group_speed=fc.speeds_of(PROFILES, TRUTH),
                      memory=lambda j: None, max_steps=3)
    assert got.cut
    assert sum(1 for f in got.jobs.values() if f.start is not None) < 10


def test_a_job_forecast_survives_a_round_trip_through_json():
    got = forecast([queued(2, time_s=1800)], [slot(jobs=(1,))], [running(1, time_s=600)])
    two = got.jobs[2]
    assert fc.JobForecast.from_dict(two.to_dict()) == two


def test_progress_left_is_the_steps_to_go_at_the_rate_as_solo_seconds():
    assert fc.progress_left(400, 1000, 2.0) == pytest.approx(300.0)
    # running at half speed beside a partner: 300 s of wall time is 150 s of solo work
    assert fc.progress_left(400, 1000, 2.0, speed=0.5) == pytest.approx(150.0)
    assert fc.progress_left(400, 0, 2.0) is None

"""The controller's forecast keeper (controller/foresight.py) and how forecasts read as text:
a forecast is made from what a round offered, only when something changed or it got old,
`queue add --test-only`'s trial adds a job without queueing it, and the sentence names the
start, its range, the GPU, the partner and the end."""
from __future__ import annotations

import time

import pytest

from iadeep_cli.controller.foresight import TRIAL_ID, Foresight, Inputs
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler import forecast as fc
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, spec_memory_mib
from iadeep_cli.scheduler.priority import order_queue
from iadeep_cli.settings import Policy
from iadeep_cli.sim.truth import TruthModel
from iadeep_cli.text import forecast_text

PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
POLICY = Policy()
NOW = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def inputs(queue, key=("a",)) -> Inputs:
    running = Job(1, "ann", JobSpec("/a.sh", time_limit_s=1800), JobState.RUNNING, NOW - 700,
                  node="n1", gpu_indices=(0,), started_at=NOW - 600)
    return Inputs(tuple(queue), (GpuSlot("n1", 0, 144000.0, 100000.0, (1,), 2),), (running,),
                  NOW, fc.planner(PlanInputs(PROFILES, TRUTH, POLICY)), fc.lefts_of(None, NOW),
                  fc.runtimes_of(None), fc.speeds_of(PROFILES, TRUTH),
                  lambda j: spec_memory_mib(j.spec, PROFILES, POLICY),
                  lambda jobs, t: order_queue(jobs, POLICY, t, None), key,
                  explain=fc.planner(PlanInputs(PROFILES, TRUTH, POLICY), reasons=True))


def waiting(job_id: int) -> Job:
    return Job(job_id, "bob", JobSpec("/b.sh", time_limit_s=900), JobState.QUEUED, NOW - 60)


def test_a_forecast_is_made_from_the_rounds_inputs_and_kept_for_readers():
    keeper = Foresight(clock=Clock())
    assert keeper.latest() is None and keeper.of(2) is None
    keeper.offer(inputs([waiting(2)]))
    assert keeper.step()
    view = keeper.of(2)
    assert view is not None
    assert view.start == pytest.approx(NOW + 1200)   # job 1 reaches its 30-minute --time
    assert (view.node, view.gpus, view.source) == ("n1", (0,), "--time")
    assert keeper.of(1).end == pytest.approx(NOW + 1200)


def test_no_new_forecast_while_nothing_changed_nor_before_the_gap_after_the_last():
    clock = Clock()
    keeper = Foresight(clock=clock, min_gap_s=5.0, every_s=60.0)
    keeper.offer(inputs([waiting(2)], key=("same",)))
    assert keeper.step()
    clock.t = 10.0
    keeper.offer(inputs([waiting(2)], key=("same",)))
    assert not keeper.step()            # unchanged, and not a minute old
    clock.t = 12.0
    keeper.offer(inputs([waiting(2), waiting(3)], key=("changed",)))
    assert keeper.step()                # the queue changed
    assert keeper.of(3) is not None
    clock.t = 13.0
    keeper.offer(inputs([waiting(2)], key=("again",)))
    assert not keeper.step()            # changed, but within 5 s of the last forecast
    clock.t = 80.0
    keeper.offer(inputs([waiting(2)], key=("again",)))
    assert keeper.step()


def test_a_forecast_that_fails_keeps_the_last_good_one():
    keeper = Foresight(clock=Clock(), min_gap_s=0.0)
    keeper.offer(inputs([waiting(2)], key=("good",)))
    keeper.step()

    def broken(*_args):
        raise RuntimeError("broken predictor")
    bad = inputs([waiting(2)], key=("bad",))
    keeper.offer(Inputs(**{**bad.__dict__, "decide": broken}))
    assert keeper.step()
    assert keeper.of(2) is not None and keeper.of(2).start == pytest.approx(NOW + 1200)


def test_a_trial_job_is_planned_behind_the_queue_and_queues_nothing():
    keeper = Foresight(clock=Clock())
    assert keeper.trial("carol", JobSpec("/c.sh"), NOW) is None   # no round yet
    keeper.offer(inputs([waiting(2)]))
    got = keeper.trial("carol", JobSpec("/c.sh", time_limit_s=600), NOW)
    assert got is not None and not got.now
    assert got.reason   # plan()'s reason it would wait now
    # behind job 2 (queued first): job 1 ends at +1200, job 2 runs 900 s, then the trial
    assert got.forecast.start == pytest.approx(NOW + 1200 + 900)
    assert keeper.of(TRIAL_ID) is None   # the kept forecast has no trial job in it


def test_the_forecast_sentence_names_start_range_place_partner_and_end():
    now = time.mktime((2026, 12, 3, 14, 0, 0, 0, 0, -1))
    text = forecast_text(now + 20 * 60, now - 10 * 60 + 600, now + 70 * 60, now + 305 * 60,
                         now, where="gpu2:0", beside=(12,), speed=0.8)
    assert text == ("expected to start ~14:20 (14:00-15:10) on gpu2:0 beside job 12 at ~0.8x; "
                    "ends ~19:05")
    assert forecast_text(None, None, None, None, now).startswith("no expected start")
    assert forecast_text(now, now, now, now + 3600, now, waiting=False) == \
        "expected to end ~15:00"


def test_a_job_reporting_its_total_has_its_work_left_from_its_rate():
    from iadeep_cli.controller.round.observer import SpeedObserver, _feed, _Track

    observer = SpeedObserver(pool=None)   # type: ignore[arg-type]   (no node is read here)
    track = _Track(node="n1")
    text = "1000.0 0 1000\n1010.0 100 1000\n1020.0 200 1000\n"
    _feed(track, 0, len(text), text)
    observer._tracks[7] = track
    # 10 iterations a second, 800 to go: 80 s
    assert observer.work_left() == {7: pytest.approx(80.0)}
    observer._tracks[8] = _Track(node="n1")   # reports no total: no entry
    assert set(observer.work_left()) == {7}
    # the framework hooks' form: the total on a `total N` line of its own, same answer
    hooks = _Track(node="n1")
    text = "1000.0 0\ntotal 1000\n1010.0 100\n1020.0 200\n"
    _feed(hooks, 0, len(text), text)
    observer._tracks[9] = hooks
    assert observer.work_left()[9] == pytest.approx(80.0)

"""``--requeue`` jobs in the scheduling loop, in process, round by round (the real loop, store,
service and planner; jobs really run on this machine: ``test_loop_unit.Lab``).

``queue requeue`` commits the intent; the loop sends the checkpoint signal once, and requeues
the job when it exits, or stops it once the lab's ``preempt_grace`` has passed and requeues
it all the same; no retry is spent. Only the job's owner or an admin may ask, and only for a
running ``--requeue`` job.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_loop_unit import Lab, _running

from iadeep_cli import messages as m
from iadeep_cli.cli.queue import _reason
from iadeep_cli.errors import InputError, InvalidTransition, PermissionDenied
from iadeep_cli.jobs import JobState
from iadeep_cli.store import jobrows


@pytest.fixture
def lab(tmp_path):
    made = Lab(tmp_path, {"n1": 1})
    yield made
    made.close()


def _catcher(got: Path, on_signal: str = "exit 0") -> str:
    """A job body that notes each USR1 it gets in ``got`` and then runs ``on_signal``."""
    return f"trap 'echo usr1 >> {got}; {on_signal}' USR1\nwhile :; do sleep 0.05; done"


def _requeue(lab: Lab, user: str, job_id: int) -> m.JobActionResult:
    [result] = lab.service.op_requeue(user, m.RequeueRequest((job_id,)))
    return result


def test_a_requeue_asked_twice_signals_the_job_once_and_spends_no_retry(lab, tmp_path):
    got = tmp_path / "got"
    job_id = lab.submit(body=_catcher(got), requeue=True, retries=0)
    lab.round()
    _running(lab, job_id)
    assert _requeue(lab, "alice", job_id).state == "requeueing"
    assert _requeue(lab, "alice", job_id).state == "requeueing"   # the intent, once
    job = lab.job(job_id)
    assert (job.preempt_for, job.checkpoint_at) == ("alice", None)   # committed, not sent
    lab.until(lambda: lab.job(job_id).checkpoints == 1)
    lab.until(lambda: lab.job(job_id).state == JobState.RUNNING)   # started again
    job = lab.job(job_id)
    assert (job.attempts, job.checkpoints, job.spec.retries) == (2, 1, 0)
    assert job.preempt_for is None and job.checkpoint_at is None   # the new attempt's: none
    assert job.preempted == ""   # said while it waited; placed again, its events keep it
    assert got.read_text() == "usr1\n"
    reasons = lab.reasons(job_id)
    assert sum("SIGUSR1 sent" in r for r in reasons) == 1
    assert any(r.startswith("queued: checkpointed on SIGUSR1 (exit code 0); requeued by alice")
               and "no retry spent" in r for r in reasons), reasons


def test_a_job_that_does_not_exit_is_stopped_after_the_grace_and_requeued(lab, tmp_path):
    got = tmp_path / "got"
    job_id = lab.submit(body=_catcher(got, on_signal="true"), requeue=True)
    lab.round()
    _running(lab, job_id)
    _requeue(lab, "alice", job_id)
    lab.until(lambda: got.exists())
    for _ in range(5):   # within the grace: it keeps running
        lab.round()
    assert lab.job(job_id).state == JobState.RUNNING
    lab.wait(lab.inventory.policy.preempt_grace_s + 1)
    lab.until(lambda: lab.job(job_id).checkpoints == 1)
    assert lab.job(job_id).attempts - lab.job(job_id).checkpoints <= lab.job(job_id).spec.retries


def test_a_signal_lost_in_a_crash_is_made_up_for_by_the_grace(lab, tmp_path):
    """The mark is committed before the signal goes: a controller that died in between left
    a job marked but never signalled; it is not signalled again (at most once), and it is
    stopped when the grace ends and requeued."""
    got = tmp_path / "got"
    job_id = lab.submit(body=_catcher(got), requeue=True)
    lab.round()
    _running(lab, job_id)
    with lab.store.tx() as conn:   # what the crash left: the intent and the mark, no signal
        now = lab.loop.clock()
        jobrows.update(conn, job_id, preempt_for="job 99", preempt_at=now, checkpoint_at=now)
    lab.round()
    lab.wait(lab.inventory.policy.preempt_grace_s + 1)
    lab.until(lambda: lab.job(job_id).checkpoints == 1)
    assert not got.exists()   # stopped, never signalled a second time
    assert any(r.startswith("queued: checkpointed on SIGUSR1 (exit code ")
               and "; preempted for job 99 at " in r for r in lab.reasons(job_id))


def test_only_the_owner_or_an_admin_may_requeue_and_only_a_running_requeue_job(tmp_path):
    lab = Lab(tmp_path, {"n1": 1, "n2": 1})
    try:
        lab.inventory = dataclasses.replace(lab.inventory, admins=("lab-admin",))
        lab.service.inventory = lab.inventory
        plain = lab.submit()
        requeueable = lab.submit(body=_catcher(tmp_path / "got"), requeue=True)
        queued = _requeue(lab, "alice", requeueable)
        assert isinstance(queued.error, InvalidTransition)
        assert queued.error.message == (f"job {requeueable} is queued; only a running job can "
                                        "be requeued")
        lab.round()
        _running(lab, plain)
        _running(lab, requeueable)
        refused = _requeue(lab, "bob", requeueable)
        assert isinstance(refused.error, PermissionDenied)
        assert "belongs to alice; bob may not change it" in refused.error.message
        assert lab.job(requeueable).preempt_for is None   # nothing recorded for bob
        no = _requeue(lab, "alice", plain)
        assert isinstance(no.error, InputError)
        assert f"job {plain} was not submitted with --requeue" in no.error.message
        assert _requeue(lab, "lab-admin", requeueable).state == "requeueing"
        assert lab.job(requeueable).preempt_for == "lab-admin"
    finally:
        lab.close()


def _preempting(lab: Lab, rule: str) -> None:
    policy = dataclasses.replace(lab.inventory.policy, preemption=rule)
    lab.inventory = dataclasses.replace(lab.inventory, policy=policy)
    lab.loop.use(lab.inventory, lab.pool)


@pytest.mark.parametrize("rule", ["las", "off"])
def test_the_labs_preemption_checkpoints_a_long_requeue_job_for_a_new_one(lab, tmp_path, rule):
    """``preemption: las``: a --requeue job that has had over an hour of GPU time holds the
    only GPU; a new job arrives. plan() names the long job in ``Plan.preempt``; the round
    signals it once, it checkpoints and is requeued (no retry spent), and the new job gets the
    GPU; the preempted job says for whom. ``off``: nobody is preempted, the new job waits."""
    _preempting(lab, rule)
    got = tmp_path / "got"
    long = lab.submit(body=_catcher(got), requeue=True)
    lab.round()
    _running(lab, long)
    lab.wait(2 * 3600)   # two hours of GPU time in this attempt
    new = lab.submit(body="exec sleep 600")
    if rule == "off":
        for _ in range(5):
            lab.round()
        assert lab.job(long).state == JobState.RUNNING and lab.job(new).state == JobState.QUEUED
        assert not got.exists() and lab.job(long).checkpoint_at is None
        return
    lab.until(lambda: lab.job(new).state == JobState.RUNNING)
    job = lab.job(long)
    assert job.state == JobState.QUEUED and (job.attempts, job.checkpoints) == (1, 1)
    assert got.read_text() == "usr1\n"
    assert job.preempted.startswith(f"preempted for job {new} at ") and \
        job.preempted.endswith("; requeued")
    reasons = lab.reasons(long)
    assert sum("SIGUSR1 sent" in r for r in reasons) == 1
    assert any(r.startswith(f"running: checkpoint: preempted for job {new} at ")
               for r in reasons), reasons
    for _ in range(3):   # it waits now (one GPU, taken); it is not preempted again
        lab.round()
    assert lab.job(long).checkpoints == 1 and got.read_text() == "usr1\n"
    # what `queue list` says of it: the preemption, then why it waits now
    view = m.JobView.from_job(lab.job(long))
    assert _reason(view).startswith(f"{job.preempted}; ") and view.preempted == job.preempted

"""``SchedulingLoop`` in process, round by round, through its ``Pool`` seam.

The loop, the store (SQLite on disk), the planner and the launcher are the real ones, and jobs
really start on this machine (``helpers.replay_pool``: real sh and processes in a temporary
workdir per node). Only what a node *says* is scripted: it answers, it answers but its GPU
query fails, or it is silent. The loop's clock runs ahead of the wall clock on demand
(``Lab.wait``), so a grace period passes without sleeping. The same rules over real sshd nodes
and controller processes: test_faults.py and test_controller_e2e.py.
"""
from __future__ import annotations

import base64
import os
import signal
import time
from pathlib import Path

import pytest

from helpers.jobprocs import kill_recorded_jobs
from helpers.replay_pool import ReplayPool
from iadeep_cli import messages as m
from iadeep_cli.controller.requests.service import Service
from iadeep_cli.controller.round.loop import SchedulingLoop
from iadeep_cli.errors import InputError, InvalidTransition, PermissionDenied
from iadeep_cli.jobs import ACTIVE, Attempt, Job, JobSpec, JobState, StopReason, SubmitSpec
from iadeep_cli.settings import Inventory, Node
from iadeep_cli.store import Store, jobrows

GRACE_S = 60.0


class Lab:
    """One controller's loop over scripted nodes; ``round()`` is one tick plus its actions."""

    def __init__(self, root: Path, gpus: dict[str, int]):
        self.root = root
        nodes = tuple(Node(name, host="localhost", local=True, workdir=str(root / "nodes" / name))
                      for name in gpus)
        self.inventory = Inventory(nodes=nodes, poll_interval_s=1.0, node_grace_s=GRACE_S)
        self.store = Store(root / "iadeep.db")
        self.pool = ReplayPool(self.inventory, gpus)
        self.ahead = 0.0
        self.loop = SchedulingLoop(self.store, self.inventory, self.pool, root / "scripts",
                                   clock=lambda: time.time() + self.ahead,
                                   fit_in_background=False)
        self.service = Service(self.store, self.inventory, self.loop.clock,
                               scripts_dir=root / "scripts")

    def submit(self, retries: int = 0, time_limit_s: float | None = None,
               signal: str | None = None, body: str = "exec sleep 600", **more) -> int:
        """A job as the service accepts one: a row, and the copy of its script."""
        script = self.root / "train.sh"
        script.write_text(f"#!/bin/sh\n{body}\n")
        spec = JobSpec(script=str(script), workload="resnet50", retries=retries,
                       time_limit_s=time_limit_s, signal=signal, **more)
        with self.store.tx() as conn:
            job_id, _ = jobrows.insert(conn, "alice", spec, self.loop.clock())
        copy = self.loop.script_copy(self.job(job_id))
        copy.parent.mkdir(parents=True)
        copy.write_text(script.read_text())
        return job_id

    def add(self, body: str = "exec sleep 600", user: str = "alice", token: str | None = None,
            **spec) -> int:
        """A job submitted through the controller's real service (``queue add``): arrays and
        dependencies are made and checked there."""
        script = self.root / "task.sh"
        script.write_text(f"#!/bin/sh\n{body}\n")
        request = m.AddRequest(SubmitSpec.from_dict({"script": str(script),
                                                     "workload": "resnet50", **spec}),
                               token=token, script_b64=base64.b64encode(
                                   script.read_bytes()).decode())
        return self.service.op_add(user, request).id

    def until(self, done, rounds: int = 200) -> None:
        """Rounds until ``done()`` (jobs take real time to exit), failing after ``rounds``."""
        for _ in range(rounds):
            if done():
                return
            self.round()
            time.sleep(0.02)
        raise AssertionError("condition not reached")

    def round(self) -> None:
        self.loop.tick()
        self.loop.actions.drain()

    def wait(self, seconds: float) -> None:
        self.ahead += seconds

    def job(self, job_id: int) -> Job:
        with self.store.tx() as conn:
            return jobrows.get(conn, job_id)

    def reasons(self, job_id: int) -> list[str]:
        with self.store.tx() as conn:
            return [f"{e['new_state']}: {e['reason']}" for e in jobrows.events(conn, job_id)]

    def jobs_dir(self, node: str) -> Path:
        return Path(self.pool.node(node).workdir) / "jobs"

    def close(self) -> None:
        """Stop every job process started here (set-aside attempts too), then the loop."""
        self.loop.actions.drain()
        for pid in kill_recorded_jobs(self.root.glob("nodes/*/jobs/*/pid")):
            _wait_gone(pid)
        self.loop.close()
        self.store.close()


def _kill(pid: int) -> None:
    """Kill a job's whole session (its leader's pid is the group id), as a reboot would, and
    wait until its leader is gone (a signal is delivered asynchronously)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _wait_gone(pid)


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} survived SIGKILL"
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:   # a zombie (nobody reaps it here) is not alive
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):   # gone, or exiting as it was read
        return False


@pytest.fixture
def lab(tmp_path):
    labs: list[Lab] = []

    def make(**gpus: int) -> Lab:
        labs.append(Lab(tmp_path, gpus))
        return labs[-1]

    yield make
    for made in labs:
        made.close()


def _silent_past_grace(lab: Lab, node: str) -> None:
    """The node stops answering, and stays silent past the node grace (a round each side)."""
    lab.pool.set_mode(node, "silent")
    lab.round()
    lab.wait(GRACE_S + 1)
    lab.round()


def _running(lab: Lab, job_id: int) -> Job:
    job = lab.job(job_id)
    assert job.state == JobState.RUNNING, lab.reasons(job_id)
    assert job.remote_pid is not None and _alive(job.remote_pid)
    return job


def test_a_queued_job_is_placed_recorded_then_launched(lab):
    lab = lab(n1=1)
    job_id = lab.submit()
    lab.round()
    job = _running(lab, job_id)
    assert (job.node, job.gpu_indices, job.attempts) == ("n1", (0,), 1)
    # the placement was committed (starting) before the launch said it runs
    assert lab.reasons(job_id) == ["queued: submitted", "starting: placed on n1:0",
                                   "running: running on n1:0"]
    assert (lab.jobs_dir("n1") / str(job_id) / "pid").read_text().split()[0] == \
        str(job.remote_pid)
    lab.round()
    assert lab.job(job_id) == job   # the poll agrees: nothing changes


def test_a_silent_node_loses_its_job_which_waits_until_its_attempt_is_known_gone(lab):
    lab = lab(n1=1, n2=1)
    job_id = lab.submit(retries=1)
    lab.round()
    first = _running(lab, job_id)
    other = "n2" if first.node == "n1" else "n1"
    lab.pool.set_mode(first.node, "silent")
    lab.round()
    assert lab.job(job_id).state == JobState.RUNNING   # silent, but not for the grace period
    lab.wait(GRACE_S + 1)
    lab.round()
    lost = lab.job(job_id)
    assert lost.state == JobState.LOST and "silent for over 60s" in lost.reason
    assert "it is requeued when the node answers" in lost.reason   # it has a retry
    for _ in range(3):   # its attempt may still run there: it is not started anywhere else
        lab.wait(GRACE_S)
        lab.round()
        assert lab.job(job_id).state == JobState.LOST
    assert not lab.jobs_dir(other).exists()
    _kill(first.remote_pid)                # the node rebooted: the attempt is gone
    lab.pool.set_mode(first.node, "up")
    lab.round()
    assert any("requeued (attempt 2 of 2 next)" in r for r in lab.reasons(job_id))
    lab.round()
    second = _running(lab, job_id)
    assert second.attempts == 2 and second.remote_pid != first.remote_pid
    assert second.orphans == ()
    assert list(lab.jobs_dir(first.node).glob(f"{job_id}.abandoned.*"))   # old dir set aside


def test_a_lost_job_without_retries_is_not_promised_a_requeue(lab):
    lab = lab(n1=1)
    job_id = lab.submit()   # no --retries
    lab.round()
    first = _running(lab, job_id)
    _silent_past_grace(lab, first.node)
    lost = lab.job(job_id)
    assert lost.state == JobState.LOST, lab.reasons(job_id)
    assert "no retries left, so it is not requeued" in lost.reason
    assert "requeued when" not in lost.reason
    _kill(first.remote_pid)


def test_a_lost_job_whose_attempt_lives_on_runs_on(lab):
    lab = lab(n1=1)
    job_id = lab.submit(retries=1)
    lab.round()
    first = _running(lab, job_id)
    _silent_past_grace(lab, "n1")
    assert lab.job(job_id).state == JobState.LOST
    lab.pool.set_mode("n1", "up")
    lab.round()
    back = _running(lab, job_id)
    assert (back.remote_pid, back.attempts) == (first.remote_pid, 1)
    assert lab.reasons(job_id)[-1] == "running: node answers again"


def test_fencing_a_silent_node_requeues_its_job_and_stops_the_old_attempt_when_it_returns(lab):
    lab = lab(n1=1, n2=1)
    job_id = lab.submit(retries=1)
    lab.round()
    first = _running(lab, job_id)
    _silent_past_grace(lab, first.node)
    assert lab.loop.fence(first.node, "pi") == [job_id]
    fenced = lab.job(job_id)
    assert fenced.state == JobState.QUEUED and fenced.orphans == (first.node,)
    lab.round()
    second = _running(lab, job_id)
    assert second.node != first.node and second.attempts == 2
    assert _alive(first.remote_pid)        # the fenced node is still silent: untouched
    lab.pool.set_mode(first.node, "up")    # it was not powered off after all
    lab.round()
    assert not _alive(first.remote_pid)    # its old attempt is stopped, the new one runs on
    assert lab.job(job_id).orphans == () and _running(lab, job_id).remote_pid == second.remote_pid


def test_a_requeued_job_drops_its_whole_attempt_even_one_lost_while_checkpointing(lab):
    """A job goes back to the queue with its attempt dropped whole (``jobs.Attempt``): one lost
    while its checkpoint signal was out, then fenced, starts a next attempt that is not taken
    for a checkpointing one (which the adapter stops once ``kill_grace`` has passed)."""
    lab = lab(n1=1, n2=1)
    job_id = lab.submit(retries=1, checkpoint_signal="USR1", signal="USR2@30",
                        time_limit_s=3600.0)
    lab.round()
    first = _running(lab, job_id)
    with lab.store.tx() as conn:   # as the adapter marks it before sending the signal
        jobrows.update(conn, job_id, checkpoint_at=lab.loop.clock(), signalled=True)
    _silent_past_grace(lab, first.node)
    assert lab.loop.fence(first.node, "pi") == [job_id]
    fenced = lab.job(job_id)
    assert fenced.state == JobState.QUEUED and fenced.attempt == Attempt()
    assert (fenced.orphans, fenced.attempts) == ((first.node,), 1)
    lab.round()
    second = _running(lab, job_id)
    lab.wait(lab.inventory.kill_grace_s + 1)
    for _ in range(3):
        lab.round()
    assert _running(lab, job_id).remote_pid == second.remote_pid


def test_a_failing_gpu_query_keeps_the_nodes_jobs_and_places_nothing_there(lab):
    lab = lab(n1=2, n2=2)
    first = lab.submit()
    lab.round()
    node = _running(lab, first).node
    lab.pool.set_mode(node, "gpu_failing")
    for _ in range(3):   # answering nodes never lose their jobs, however long their GPUs fail
        lab.wait(GRACE_S)
        lab.round()
        assert lab.job(first).state == JobState.RUNNING
    second = lab.submit()
    lab.round()
    # with its GPUs readable, the node with the fewest empty GPUs would have been chosen: node
    assert _running(lab, second).node != node


def test_a_failed_launch_backs_the_node_off_and_the_job_runs_elsewhere(lab):
    lab = lab(n1=1, n2=2)
    broken = Path(lab.pool.node("n1").workdir)
    broken.parent.mkdir()
    broken.write_text("not a directory")   # so mkdir fails there
    job_id = lab.submit()
    lab.round()
    starting = lab.job(job_id)
    assert (starting.state, starting.node) == (JobState.STARTING, "n1")   # fewest empty GPUs
    assert "n1" in lab.loop.launch_health()
    lab.round()
    job = _running(lab, job_id)
    assert job.node == "n2" and job.attempts == 1   # the launch that never happened is free
    assert any(r.startswith("queued: launch on n1 failed") and "n1 is skipped for" in r
               for r in lab.reasons(job_id))


def test_a_job_kept_to_a_skipped_node_is_told_the_launch_failure_first_not_a_node_down(lab):
    """plan() sees the skipped node only as offering no GPUs and guesses "down, or not in the
    inventory"; the round knows better and says the real cause first (issue 47, item 4)."""
    lab = lab(n1=1, n2=1)
    broken = Path(lab.pool.node("n1").workdir)
    broken.parent.mkdir()
    broken.write_text("not a directory")   # so mkdir fails there
    job_id = lab.submit(nodelist=("n1",))
    lab.round()                            # placed on n1; the launch fails there
    assert "n1" in lab.loop.launch_health()
    lab.round()
    waiting = lab.job(job_id)
    assert waiting.state == JobState.QUEUED
    assert waiting.reason.startswith("node n1 is skipped until "), waiting.reason
    assert "its last launch failed" in waiting.reason and "down" not in waiting.reason
    assert "no node it may run on (--nodelist n1) has GPUs to offer now" in waiting.reason


def test_a_job_past_its_time_limit_is_stopped_and_timed_out_saying_why(lab):
    lab = lab(n1=1)
    job_id = lab.submit(time_limit_s=300)
    lab.round()
    job = _running(lab, job_id)
    lab.wait(299)
    lab.round()
    assert _running(lab, job_id).stop_reason is None   # 299 s: within its limit
    lab.wait(2)
    lab.round()                            # past it: asked to stop, stopped on the node's worker
    deadline = time.monotonic() + 30
    while lab.job(job_id).state == JobState.RUNNING:
        assert time.monotonic() < deadline, lab.reasons(job_id)
        lab.round()
    assert not _alive(job.remote_pid)
    ended = lab.job(job_id)
    assert ended.state == JobState.TIMEOUT and ended.reason == "time limit 0:05:00 reached"
    assert ended.exit_code is not None and ended.exit_code != 0


def test_a_cancel_ends_the_job_when_each_stop_outlasts_the_gap_between_polls(lab):
    """A loaded node: every poll takes longer than a stop, so a stop sent at the end of one
    round ends while the next poll runs. Reconcile waits for a poll newer than the job's last
    action; were the stop sent again each round, no poll would ever be newer (CI saw a
    cancelled job run on for 30 s). Rounds here are not drained: actions overlap polls as in
    the controller."""
    lab = lab(n1=1)
    job_id = lab.submit()
    lab.round()
    job = _running(lab, job_id)
    polls = lab.pool.poll_all

    def slow_poll(*args, **kwargs):
        snapshot = polls(*args, **kwargs)
        time.sleep(0.3)   # the answer comes late; its taken_at is when it began
        return snapshot

    lab.pool.poll_all = slow_poll
    with lab.store.tx() as conn:
        jobrows.update(conn, job_id, cancel_requested_by="alice", stop_reason=StopReason.CANCELLED)
    for _ in range(40):
        lab.loop.tick()
        if lab.job(job_id).state != JobState.RUNNING:
            break
    assert lab.job(job_id).state == JobState.CANCELLED, lab.reasons(job_id)
    assert not _alive(job.remote_pid)


def test_the_time_limit_counts_from_each_attempts_start(lab):
    lab = lab(n1=1)
    job_id = lab.submit(retries=1, time_limit_s=300)
    lab.round()
    first = _running(lab, job_id)
    lab.wait(200)
    _kill(first.remote_pid)                # the attempt dies without an exit code: requeued
    lab.round()
    lab.round()
    second = _running(lab, job_id)
    assert second.attempts == 2
    lab.wait(200)                          # 400 s since the first start, 200 s into this one
    lab.round()
    assert _running(lab, job_id).stop_reason is None


def test_a_job_gets_its_signal_before_its_time_limit_once(lab, tmp_path):
    lab = lab(n1=1)
    got = tmp_path / "got-usr1"
    job_id = lab.submit(time_limit_s=300, signal="USR1@60", body=(
        f"trap 'echo checkpoint >> {got}' USR1\nwhile :; do sleep 0.1; done"))
    lab.round()
    job = _running(lab, job_id)
    lab.wait(239)
    lab.round()
    assert not lab.job(job_id).signalled and not got.exists()   # 61 s before the limit
    lab.wait(2)
    lab.round()                              # 59 s before: USR1, on the node's worker
    assert lab.job(job_id).signalled
    deadline = time.monotonic() + 30
    while not got.exists():
        assert time.monotonic() < deadline, "the job never got USR1"
        time.sleep(0.05)
    lab.wait(30)
    lab.round()
    assert _running(lab, job_id).remote_pid == job.remote_pid   # it survived its own signal
    time.sleep(0.5)                          # time for a second signal to land, were one sent
    assert got.read_text() == "checkpoint\n"
    lab.wait(31)                             # the limit: stopped
    lab.round()
    deadline = time.monotonic() + 30
    while lab.job(job_id).state == JobState.RUNNING:
        assert time.monotonic() < deadline, lab.reasons(job_id)
        lab.round()
    assert lab.job(job_id).state == JobState.TIMEOUT



# ---------------------------------------------------------------- dependencies, arrays, retries
def test_a_chain_starts_its_next_job_only_after_the_first_succeeded(lab, tmp_path):
    lab = lab(n1=2)
    go = tmp_path / "go"
    first = lab.add(body=f"while [ ! -e {go} ]; do sleep 0.05; done")
    second = lab.add(after=[first])
    lab.round()
    lab.round()
    assert lab.job(first).state == JobState.RUNNING
    assert lab.job(second).state == JobState.QUEUED   # a GPU is free, yet it waits
    assert lab.job(second).reason == f"waiting for job {first} (running)"
    go.touch()
    lab.until(lambda: lab.job(first).state == JobState.SUCCEEDED)
    lab.until(lambda: lab.job(second).state == JobState.RUNNING)
    with lab.store.tx() as conn:   # it was placed only after its dependency had ended
        ended = jobrows.get(conn, first).ended_at
    assert ended is not None and lab.job(second).started_at >= ended


def test_a_failed_dependency_cancels_the_chain_and_starts_the_cleanup(lab):
    lab = lab(n1=4)
    first = lab.add(body="exit 3")
    second = lab.add(after=[first])
    third = lab.add(after=[second])                  # cancelled in the same round as second
    cleanup = lab.add(after_fail=[first], body="exit 0")
    anyway = lab.add(after_any=[first], body="exit 0")
    lab.until(lambda: lab.job(first).state == JobState.FAILED)
    lab.until(lambda: lab.job(third).state == JobState.CANCELLED, rounds=2)
    assert lab.job(second).reason == f"dependency {first} failed"
    assert lab.job(third).reason == f"dependency {second} was cancelled"
    assert lab.reasons(third)[-1] == f"cancelled: dependency {second} was cancelled"
    lab.until(lambda: {lab.job(cleanup).state, lab.job(anyway).state} == {JobState.SUCCEEDED})


def test_after_fail_is_cancelled_when_its_dependency_succeeds(lab):
    lab = lab(n1=1)
    first = lab.add(body="exit 0")
    cleanup = lab.add(after_fail=[first])
    lab.until(lambda: lab.job(cleanup).state == JobState.CANCELLED)
    assert lab.job(cleanup).reason == f"dependency {first} succeeded (it was --after-fail)"


def test_dependencies_are_checked_at_submission_and_an_array_id_means_its_tasks(lab):
    lab = lab(n1=1)
    with pytest.raises(InputError, match="--after 99: there is no job 99"):
        lab.add(after=[99])
    bobs = lab.add(user="bob")                       # another user's job is fine to depend on
    array = lab.add(array="0-2")
    waiter = lab.add(after=[bobs, array])
    assert lab.job(waiter).spec.after == (bobs, array, array + 1, array + 2)


def test_an_array_runs_every_index_once_never_more_than_its_limit_at_once(lab, tmp_path):
    lab = lab(n1=4)
    seen = tmp_path / "seen"
    array = lab.add(array="0-5%2", body=f'echo "$IADEEP_ARRAY_JOB_ID $IADEEP_ARRAY_INDEX" '
                    f'>> {seen}; sleep 0.3')
    with lab.store.tx() as conn:
        tasks = jobrows.array_tasks(conn, array)
    assert [(t.array_id, t.array_index) for t in tasks] == [(array, i) for i in range(6)]
    most = 0

    def all_done() -> bool:
        nonlocal most
        states = [lab.job(t.id).state for t in tasks]
        most = max(most, sum(s in ACTIVE for s in states))
        return all(s == JobState.SUCCEEDED for s in states)

    lab.round()
    waiting = [lab.job(t.id) for t in tasks if lab.job(t.id).state == JobState.QUEUED]
    assert len(waiting) == 4 and waiting[0].reason == (
        f"array {array}: 2 of its tasks running, at most 2 at once (--array %2)")
    lab.until(all_done)
    assert most == 2
    assert sorted(seen.read_text().splitlines()) == [f"{array} {i}" for i in range(6)]


def test_an_array_is_submitted_whole_once_and_acted_on_whole_or_by_task(lab):
    lab = lab(n1=1)
    array = lab.add(array="1,3,5", token="t1", body="exit 0")
    assert lab.add(array="1,3,5", token="t1") == array   # a retried submission: no new tasks
    with lab.store.tx() as conn:
        ids = [t.id for t in jobrows.array_tasks(conn, array)]
        assert len(jobrows.select(conn)) == 3
    with pytest.raises(InputError, match="more than 10000 tasks"):
        lab.add(array="0-10000")
    held = lab.service.op_hold("alice", m.HoldRequest((array,)))
    assert [(r.id, r.state) for r in held] == [(i, "held") for i in ids]
    one = lab.service.op_release("alice", m.ReleaseRequest((), tasks=((array, 3),)))
    assert [(r.id, r.state) for r in one] == [(ids[1], "queued")]
    lab.service.op_priority("alice", m.PriorityRequest(array, 7))
    assert [lab.job(i).spec.priority for i in ids] == [7, 7, 7]
    refused = lab.service.op_cancel("bob", m.CancelRequest((array,)))
    assert all(r.error is not None for r in refused)
    done = lab.service.op_cancel("alice", m.CancelRequest((array,)))
    assert [r.state for r in done] == ["cancelled"] * 3


def test_retry_on_fail_requeues_a_nonzero_exit_until_its_retries_are_spent(lab):
    lab = lab(n1=1)
    plain = lab.submit(retries=2, body="exit 3")
    lab.until(lambda: lab.job(plain).state == JobState.FAILED)
    assert lab.job(plain).attempts == 1              # a non-zero exit alone: no retry
    retried = lab.submit(retries=1, retry_on_fail=True, body="exit 3")
    lab.until(lambda: lab.job(retried).state == JobState.FAILED)
    job = lab.job(retried)
    assert (job.attempts, job.exit_code) == (2, 3)
    assert "queued: exited with code 3; requeued (attempt 2 of 2 next)" in lab.reasons(retried)


def test_rerun_submits_a_finished_job_again_as_a_new_job(lab):
    lab = lab(n1=1)
    first = lab.add(body="exit 3", args=["x y"])
    with pytest.raises(InvalidTransition, match="only a finished job"):
        lab.service.op_rerun("alice", m.RerunRequest(first))
    lab.until(lambda: lab.job(first).state == JobState.FAILED)
    with pytest.raises(PermissionDenied):
        lab.service.op_rerun("bob", m.RerunRequest(first))
    again = lab.service.op_rerun("alice", m.RerunRequest(first, token="r1")).id
    assert lab.service.op_rerun("alice", m.RerunRequest(first, token="r1")).id == again
    job = lab.job(again)
    assert (job.rerun_of, job.spec.args, job.owner) == (first, ("x y",), "alice")
    assert lab.reasons(again) == [f"queued: rerun of job {first} by alice"]
    lab.until(lambda: lab.job(again).state == JobState.FAILED)

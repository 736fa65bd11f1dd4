"""Run-time adaptation in the real ``SchedulingLoop``, round by round (as test_loop_unit.py):
real store, planner, launcher and job processes on this machine (``helpers.replay_pool``), and
stand-in jobs whose speed really halves while they share (``helpers/contention.py``).

Checks: a pair running worse than serial gets an event with its numbers and no new partners,
the job that joined last is suspended (its processes really stopped) and resumed (really
continued) when its partner ends, both finish once; and a controller that died in the middle
(a new loop over the same database) neither loses a job nor leaves one stopped.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

# EMU: a light workload the model lets share (predicted ~0.9 each), at the emulator's rate
from helpers.adapt_lab import EMU, EMULATOR
from helpers.jobprocs import kill_recorded_jobs
from helpers.replay_pool import ReplayPool
from iadeep_cli.controller.round.loop import SchedulingLoop
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.settings import AdaptPolicy, FairShare, Inventory, Node, Policy
from iadeep_cli.snapshot import GpuProcess
from iadeep_cli.store import Store, jobrows, profiles as profrows

pytestmark = pytest.mark.unit
# quick to find, and every action on (suspending and closing GPUs are off by default)
FAST = AdaptPolicy(observe_s=0, polls=3, window_s=1.0, suspend=True, stop_partners=True)


class Lab:
    def __init__(self, root: Path, policy: AdaptPolicy = FAST, store: Store | None = None,
                 fairshare: FairShare | None = None):
        self.root = root
        node = Node("n1", host="localhost", local=True, workdir=str(root / "nodes" / "n1"))
        self.inventory = Inventory(nodes=(node,), poll_interval_s=0.2,
                                   policy=Policy(adapt=policy, fairshare=fairshare))
        self.store = store or Store(root / "iadeep.db")
        with self.store.tx() as conn:
            profrows.upsert_profile(conn, EMU, time.time())
        self.pool = ReplayPool(self.inventory, {"n1": 1})
        self.busy(97.0)   # a GPU time-sliced between two jobs is busy (the shipped pairs: 96-97%)
        self.before_round: Callable[[], None] | None = None   # e.g. what the GPU shows next
        self.loop = SchedulingLoop(self.store, self.inventory, self.pool, root / "scripts",
                                   fit_in_background=False)

    def submit(self, iters: int, owner: str = "alice", **spec) -> int:
        checkpoint = "ckpt" if spec.get("checkpoint_signal") else ""
        script = self.root / "emu.sh"
        script.write_text(f"#!/bin/sh\nexec {sys.executable} {EMULATOR} "
                          f"{self.root / 'gpu-n1-0'} {iters} {checkpoint}\n")
        with self.store.tx() as conn:
            job_id, _ = jobrows.insert(conn, owner, JobSpec(str(script), workload="emu",
                                                            **spec), time.time())
        copy = self.loop.script_copy(self.job(job_id))
        copy.parent.mkdir(parents=True)
        copy.write_text(script.read_text())
        return job_id

    def busy(self, util: float) -> None:
        """The utilisation the node's poll reports for its GPU from now on."""
        self.pool.gpus["n1"] = tuple(replace(g, utilization_gpu=util)
                                     for g in self.pool.gpus["n1"])

    def round(self) -> None:
        if self.before_round is not None:
            self.before_round()
        self.loop.tick()
        self.loop.actions.drain()
        time.sleep(0.2)

    def until(self, done, rounds: int = 300) -> None:
        for _ in range(rounds):
            if done():
                return
            self.round()
        raise AssertionError("condition not reached")

    def job(self, job_id: int) -> Job:
        with self.store.tx() as conn:
            return jobrows.get(conn, job_id)

    def events(self, job_id: int) -> list[str]:
        with self.store.tx() as conn:
            return [f"{e['old_state']}->{e['new_state']}: {e['reason']}"
                    for e in jobrows.events(conn, job_id)]

    def close(self) -> None:
        self.loop.actions.drain()
        kill_recorded_jobs(self.root.glob("nodes/*/jobs/*/pid"))
        self.loop.close()


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP): its state letter in /proc is T."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def job_pids(lab: Lab, job_id: int) -> list[int]:
    """The job's processes here (its session: the wrapper and the emulator)."""
    sid = lab.job(job_id).remote_pid
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):   # gone, or exiting as read
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(entry))
    return out


@pytest.fixture
def make(tmp_path):
    labs: list[Lab] = []

    def factory(**kw) -> Lab:
        labs.append(Lab(tmp_path, **kw))
        return labs[-1]

    yield factory
    for lab in labs:
        lab.close()


def pair(lab: Lab, first_iters: int = 600, second_iters: int = 150, **second) -> tuple[int, int]:
    """The first job running alone with a measured speed, then the second joining its GPU."""
    a = lab.submit(first_iters)
    lab.until(lambda: lab.job(a).observed_speed is not None)
    b = lab.submit(second_iters, **second)
    lab.until(lambda: lab.job(b).state == JobState.RUNNING)
    return a, b


def test_a_pair_worse_than_serial_is_split_and_rejoined(make):
    lab = make()
    a, b = pair(lab)
    assert lab.job(b).node == lab.job(a).node and lab.job(b).gpu_indices == (0,)
    lab.until(lambda: lab.job(b).state == JobState.SUSPENDED)
    # the numbers that caused it, on both jobs; queue why says it
    shared = [e for e in lab.events(a) if e.startswith("running->running: adapt: n1:0")]
    assert shared and "worse than serial" in shared[0] and "speeds sum to" in shared[0]
    assert "no new partners join it" in shared[0]
    suspended = lab.job(b)
    assert suspended.reason.startswith("suspended: n1:0 ") and f"job {a} leaves n1:0" in \
        suspended.reason and suspended.suspended_for == a
    lab.until(lambda: job_pids(lab, b) and all(stopped(p) for p in job_pids(lab, b)))
    # the partner runs on alone until it ends; then b is resumed (really) and ends too
    lab.until(lambda: lab.job(a).state == JobState.SUCCEEDED)
    lab.until(lambda: lab.job(b).state != JobState.SUSPENDED)
    assert not any(stopped(p) for p in job_pids(lab, b))
    lab.until(lambda: lab.job(b).state == JobState.SUCCEEDED)
    done = lab.job(b)
    assert done.attempts == 1 and done.suspended_s > 0 and done.suspended_at is None
    moves = [e.split(":")[0] for e in lab.events(b)]
    assert moves == ["None->queued", "queued->starting", "starting->running",
                     "running->running", "running->suspended", "suspended->running",
                     "running->succeeded"]
    assert "not counted against --time" in lab.events(b)[5]


def test_the_default_actions_suspend_nobody_and_close_no_gpu(make):
    """By default only the phase refresh acts: a pair worse than serial is reported (the
    event, with its numbers) and left running, its GPU open to partners."""
    lab = make(policy=replace(AdaptPolicy(), observe_s=0, polls=3, window_s=1.0))
    a, b = pair(lab, first_iters=300)
    lab.until(lambda: any("adapt:" in e for e in lab.events(b)))
    found = next(e for e in lab.events(b) if "adapt:" in e)
    assert "worse than serial" in found and "no new partners" not in found
    assert "suspended" not in found
    lab.until(lambda: lab.job(a).state == JobState.SUCCEEDED)
    assert JobState.SUSPENDED.value not in "".join(lab.events(b))


def test_a_no_adapt_job_that_joined_last_gets_nobody_suspended(make):
    """Its partner was there first: it does not pay for the other's opt-out."""
    lab = make()
    a, b = pair(lab, first_iters=400, second_iters=400, no_adapt=True)
    lab.until(lambda: "nobody is suspended" in (lab.job(a).reason or ""))
    assert f"job {b}, the last to join of those slowed, is --no-adapt" in lab.job(a).reason
    lab.until(lambda: lab.job(b).state == JobState.SUCCEEDED)
    lab.until(lambda: lab.job(a).state == JobState.SUCCEEDED)
    assert not [e for e in lab.events(a) + lab.events(b) if "->suspended" in e.split(":")[0]]


def test_a_gpu_the_poll_shows_idle_gets_nobody_suspended(make):
    """The node's own measurement must agree: jobs slowed on a GPU busy 20% of the time are
    not slowed by sharing it (their own reports notwithstanding)."""
    lab = make()
    lab.busy(20.0)
    a, b = pair(lab, first_iters=400, second_iters=150)
    lab.until(lambda: "nobody is suspended" in (lab.job(b).reason or ""))
    assert "the GPU was busy 20% (< busy_util 50%)" in lab.job(b).reason
    lab.until(lambda: lab.job(b).state == JobState.SUCCEEDED)
    assert not [e for e in lab.events(a) + lab.events(b) if "->suspended" in e.split(":")[0]]


def test_a_suspension_ends_at_the_labs_bound_and_is_not_repeated(make):
    lab = make(policy=replace(FAST, max_suspend_s=2))
    a, b = pair(lab, first_iters=10**6, second_iters=300)
    lab.until(lambda: lab.job(b).state == JobState.SUSPENDED)
    # its partner runs on, yet it is resumed after 2 s and runs to its end beside it
    lab.until(lambda: lab.job(b).state == JobState.SUCCEEDED)
    assert lab.job(a).state == JobState.RUNNING
    moves = [e.split(":")[0] for e in lab.events(b)]
    assert moves.count("running->suspended") == 1
    resumed = [e for e in lab.events(b) if e.startswith("suspended->running")]
    assert "the lab's limit (max_suspend_s 2); not suspended for others again" in resumed[0]


def test_a_crash_between_commit_and_signal_is_finished_by_the_next_controller(make, tmp_path):
    """The suspension committed, the controller dead before its SIGSTOP: the next one sends it
    (the partner is still there); once the partner ends it resumes the job. And a job that was
    lost while stopped and is seen running again gets its SIGCONT."""
    lab = make(policy=AdaptPolicy(enabled=True, suspend=False, observe_s=10**6))
    a, b = pair(lab)
    with lab.store.tx() as conn:   # what the dead controller committed, and nothing more
        jobrows.transition(conn, b, JobState.SUSPENDED, "suspended: test", "controller",
                           time.time(), suspended_at=time.time(), suspended_for=a)
    assert not any(stopped(p) for p in job_pids(lab, b))
    lab.loop.close()
    again = make(policy=FAST, store=lab.store)   # the restarted controller
    again.until(lambda: job_pids(again, b) and all(stopped(p) for p in job_pids(again, b)))
    assert again.job(b).state == JobState.SUSPENDED
    again.until(lambda: again.job(a).state == JobState.SUCCEEDED)
    again.until(lambda: again.job(b).state == JobState.SUCCEEDED)
    assert again.job(b).attempts == 1 and again.job(a).attempts == 1


def test_a_running_job_left_stopped_is_continued(make):
    lab = make(policy=AdaptPolicy(suspend=False, observe_s=10**6))
    a = lab.submit(100)
    lab.until(lambda: lab.job(a).state == JobState.RUNNING and job_pids(lab, a))
    for pid in job_pids(lab, a):
        os.kill(pid, signal.SIGSTOP)
    # as after: suspended, node silent (lost), node back (running): suspended_at still set
    with lab.store.tx() as conn:
        jobrows.update(conn, a, suspended_at=time.time() - 5)
    lab.until(lambda: lab.job(a).state == JobState.SUCCEEDED)
    assert lab.job(a).suspended_at is None and lab.job(a).suspended_s >= 5


def test_suspended_time_is_not_counted_against_the_time_limit(make):
    lab = make(policy=AdaptPolicy(suspend=False, observe_s=10**6))
    a = lab.submit(100_000, time_limit_s=60)
    lab.until(lambda: lab.job(a).state == JobState.RUNNING)
    # 100 s since it started, 50 of them suspended: 50 s count, under its 60 s
    with lab.store.tx() as conn:
        jobrows.update(conn, a, started_at=time.time() - 100, suspended_s=50.0)
    for _ in range(3):
        lab.round()
    assert lab.job(a).state == JobState.RUNNING and lab.job(a).stop_reason is None
    with lab.store.tx() as conn:   # 30 of them suspended: 70 s count, past 60
        jobrows.update(conn, a, suspended_s=30.0)
    lab.until(lambda: lab.job(a).state == JobState.TIMEOUT)


def test_a_checkpointing_job_is_signalled_requeued_and_resumes(make, tmp_path):
    """--checkpoint-signal USR1: the last joiner of a pair worse than serial gets USR1 instead
    of SIGSTOP, saves and exits; it is queued again (no retry spent), waits while its old
    partner keeps the GPU (closed to it), starts again in the same working directory and
    resumes from its checkpoint."""
    lab = make()
    workdir = tmp_path / "work"
    workdir.mkdir()
    a, b = pair(lab, first_iters=600, second_iters=400, checkpoint_signal="USR1",
                workdir=str(workdir))
    lab.until(lambda: lab.job(b).checkpoints == 1)
    requeued = lab.job(b)
    assert requeued.state == JobState.QUEUED and lab.job(a).state == JobState.RUNNING
    assert "n1:0 takes no new partners: " in requeued.reason
    assert f"job {b} was checkpointed off it" in requeued.reason
    assert requeued.yielded == ("n1:0", a)
    saved = int((workdir / "ckpt").read_text())
    assert saved > 0
    events = lab.events(b)
    assert any(e.startswith("running->running: checkpoint: n1:0 ") and "SIGUSR1 sent" in e
               for e in events)
    assert any(e.startswith("running->queued: checkpointed on SIGUSR1 (exit code 0)")
               for e in events)
    lab.until(lambda: lab.job(a).state == JobState.SUCCEEDED)
    lab.until(lambda: lab.job(b).state == JobState.SUCCEEDED)
    done = lab.job(b)
    assert (done.attempts, done.checkpoints) == (2, 1)
    # its second attempt started after a had left (the GPU was closed to it meanwhile)
    starts = [e for e in lab.events(b) if e.startswith("queued->starting")]
    assert len(starts) == 2
    log = (Path(lab.pool.node("n1").workdir) / "jobs" / str(b) / "log").read_text()
    assert f"resumed from {saved}" in log and "done" in log


def _opportunistic_then_regular(lab: Lab, iters: int) -> tuple[int, int]:
    """An --opportunistic job of ``iters`` alone on the one GPU, running, then a regular job
    that needs that GPU: (the opportunistic job, the regular one)."""
    o = lab.submit(iters, opportunistic=True, exclusive=True)
    lab.until(lambda: lab.job(o).state == JobState.RUNNING and job_pids(lab, o))
    return o, lab.submit(100)


def test_an_opportunistic_job_yields_to_a_regular_one(make):
    """--opportunistic (AntMan's idea): a regular job that waits for the GPU an opportunistic
    job holds gets it: the opportunistic job is suspended in place (memory kept, processes
    stopped), the regular job starts there, and the opportunistic job resumes when it left."""
    lab = make()
    o, r = _opportunistic_then_regular(lab, 500)
    lab.until(lambda: lab.job(o).state == JobState.SUSPENDED)
    assert lab.job(o).reason == (f"suspended: opportunistic: regular job {r} waits for n1:0; "
                                 "resumed when it leaves")
    lab.until(lambda: lab.job(r).state in (JobState.RUNNING, JobState.SUCCEEDED))
    assert (lab.job(r).node, lab.job(r).gpu_indices) == ("n1", (0,))
    assert lab.job(o).state == JobState.SUSPENDED or lab.job(r).state == JobState.SUCCEEDED
    lab.until(lambda: lab.job(r).state == JobState.SUCCEEDED)
    lab.until(lambda: lab.job(o).state == JobState.SUCCEEDED)
    moves = [e.split(":")[0] for e in lab.events(o)]
    assert moves == ["None->queued", "queued->starting", "starting->running",
                     "running->suspended", "suspended->running", "running->succeeded"]
    assert lab.job(o).attempts == 1 and lab.job(r).attempts == 1


def test_an_opportunistic_job_yields_with_the_defaults(make):
    """The defaults (``suspend: false``) turn off suspending one job of a pair worse than
    serial, not what --opportunistic asks for: the opportunistic job still yields and resumes
    after (and ``yield_opportunistic: false``, the next test, keeps it running: the regular
    job waits)."""
    assert not AdaptPolicy().suspend
    lab = make(policy=AdaptPolicy())
    o, r = _opportunistic_then_regular(lab, 500)
    lab.until(lambda: lab.job(o).state == JobState.SUSPENDED)
    lab.until(lambda: lab.job(r).state == JobState.SUCCEEDED)
    lab.until(lambda: lab.job(o).state == JobState.SUCCEEDED)
    assert [e.split(":")[0] for e in lab.events(o)][3:5] == ["running->suspended",
                                                             "suspended->running"]


def test_an_opportunistic_job_keeps_its_gpu_with_yielding_off(make):
    lab = make(policy=replace(FAST, yield_opportunistic=False))
    o, r = _opportunistic_then_regular(lab, 300)
    lab.until(lambda: lab.job(o).state == JobState.SUCCEEDED)
    lab.until(lambda: lab.job(r).state == JobState.SUCCEEDED)
    assert "running->suspended" not in [e.split(":")[0] for e in lab.events(o)]
    assert lab.job(r).started_at >= lab.job(o).ended_at


def test_an_opportunistic_job_yields_to_the_job_fair_share_would_start_first(tmp_path):
    """The trial that decides whom an opportunistic job yields to asks plan() as the round does:
    with fair share on, bob (100 GPU-hours this week) waits behind carol (none) though he
    submitted first, so the GPU is made free for carol's job, the one the round then starts."""
    lab = Lab(tmp_path, fairshare=FairShare())
    now, hour = time.time(), 3600.0
    with lab.store.tx() as c:      # bob's week, recorded as the controller records a job
        old, _ = jobrows.insert(c, "bob", JobSpec("/old.sh"), now - 102 * hour)
        jobrows.transition(c, old, JobState.STARTING, "placed", "controller", now - 101 * hour,
                           node="gone", gpu_indices=(0,))
        jobrows.transition(c, old, JobState.RUNNING, "started", "controller", now - 101 * hour)
        jobrows.transition(c, old, JobState.SUCCEEDED, "exit 0", "controller", now - hour,
                           exit_code=0)
    try:
        o = lab.submit(500, opportunistic=True, exclusive=True)
        lab.until(lambda: lab.job(o).state == JobState.RUNNING and job_pids(lab, o))
        bob = lab.submit(50, owner="bob", exclusive=True)
        carol = lab.submit(50, owner="carol", exclusive=True)
        lab.until(lambda: lab.job(o).state == JobState.SUSPENDED)
        assert lab.job(o).reason == (f"suspended: opportunistic: regular job {carol} waits "
                                     "for n1:0; resumed when it leaves")
        lab.until(lambda: lab.job(carol).state != JobState.QUEUED)
        assert lab.job(bob).state == JobState.QUEUED
    finally:
        lab.close()


def test_in_a_bad_pair_the_opportunistic_job_is_suspended_though_it_came_first(make):
    lab = make()
    o = lab.submit(400, opportunistic=True)
    lab.until(lambda: lab.job(o).observed_speed is not None)
    r = lab.submit(200)   # predicted to share well, so it joins: nothing had to yield
    lab.until(lambda: lab.job(r).state == JobState.RUNNING)
    assert lab.job(r).gpu_indices == (0,) and lab.job(o).state == JobState.RUNNING
    lab.until(lambda: lab.job(o).state == JobState.SUSPENDED)   # the pair ran worse than serial
    assert lab.job(o).suspended_for == r and lab.job(r).state == JobState.RUNNING
    lab.until(lambda: lab.job(r).state == JobState.SUCCEEDED)
    lab.until(lambda: lab.job(o).state == JobState.SUCCEEDED)
    assert JobState.SUSPENDED.value not in "".join(
        e.split(":")[0] for e in lab.events(r))


def test_a_job_that_changes_phase_while_sharing_refreshes_its_profile(make):
    """Where the poll has per-process figures (NVML), a sharing job's own SM share over its
    speed (measured from its progress) estimates its utilisation alone. The stand-in GPU here
    gives each job the SM share a time-sliced GPU would: its utilisation alone (EMU's 20%)
    times its measured speed (the GPU's utilisation: their sum); from a point on, job a's is
    that of an 80% workload. The controller finds a's phase change while it shares, with the
    numbers, and holds the refreshed profile as its owner's; its partner, unchanged, gets
    none."""
    lab = make(policy=replace(AdaptPolicy(), observe_s=0, polls=3, window_s=1.0,
                              phase_persist_s=1.0))
    alone_util = {}

    def gpu_follows_the_jobs() -> None:
        procs = []
        for job_id, util in alone_util.items():
            speed = lab.job(job_id).observed_speed
            if speed is not None:
                procs.append(GpuProcess(pid=1000 + job_id, used_memory_mib=1024.0,
                                        job_id=job_id, sm_util=round(util * speed, 1)))
        busy = min(100.0, sum(p.sm_util or 0.0 for p in procs))
        lab.pool.gpus["n1"] = (replace(lab.pool.gpus["n1"][0], processes=tuple(procs),
                                       utilization_gpu=busy),)

    lab.before_round = gpu_follows_the_jobs
    a = lab.submit(2000)
    alone_util[a] = EMU.gpu_util
    lab.until(lambda: lab.job(a).observed_speed is not None)
    b = lab.submit(2000)
    alone_util[b] = EMU.gpu_util
    lab.until(lambda: lab.job(b).state == JobState.RUNNING)
    shared_before = time.time()
    lab.until(lambda: lab.loop.observer.progress_speeds.keys() >= {a, b}
              and time.time() - shared_before > 3)
    assert not [e for e in lab.events(a) + lab.events(b) if "phase change" in e]
    alone_util[a] = 80.0
    lab.until(lambda: any("phase change" in e for e in lab.events(a)))
    [found] = [e for e in lab.events(a) if "phase change" in e]
    assert f"phase change: job {a} (emu) sharing its GPU" in found
    assert "GPU utilisation 20% -> " in found and "held as alice's" in found
    with lab.store.tx() as conn:
        refreshed = profrows.held(conn)[("alice", "emu")]
    assert refreshed.gpu_util is not None and 60 <= refreshed.gpu_util <= 100
    assert refreshed.mem_util == EMU.mem_util     # what a shared GPU does not show per job
    assert lab.job(a).state == lab.job(b).state == JobState.RUNNING
    assert not [e for e in lab.events(b) if "phase change" in e]


def test_a_pair_one_members_jobs_report_is_held_as_theirs_not_the_labs(make, monkeypatch):
    """Issue 41: two of one member's jobs reporting their rates while they share stored a lab
    co-location row, which the model's refit and self-tuning trust. It is held as that
    member's (their word alone) and read by neither."""
    from iadeep_cli.controller.round import observer as observe

    monkeypatch.setattr(observe, "MIN_TOGETHER_S", 1.0)   # a pair is recorded after 1 s together
    lab = make(policy=replace(AdaptPolicy(), observe_s=0, polls=3, window_s=1.0))   # no action
    a, b = pair(lab, first_iters=600, second_iters=600)

    def rows() -> list[dict]:
        with lab.store.tx() as conn:
            return profrows.colocation_rows(conn)

    lab.until(rows)
    [row] = rows()
    with lab.store.tx() as conn:
        assert row["workloads"] == ["emu", "emu"] and row["owners"] == ["alice"]
        assert row["kind"] == "held" and row["note"].startswith(
            f"progress of jobs {a} (alice) and {b} (alice); held as alice's")
        assert profrows.load_colocations(conn) == []

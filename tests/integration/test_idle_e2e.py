"""Idle GPU holders end to end: a real sshd node whose stand-in nvidia-smi reports its GPU at
0 % (or busy), a real controller process, a real webhook sink. A job that holds an idle GPU past
``idle_after`` is marked idle (`queue list`, `queue why`, `queue show`), its owner is told once
per attempt, and ``idle_action: requeue`` puts it back in the queue exactly once.
"""
from __future__ import annotations

import json
import sqlite3
import time

import pytest

from helpers.controllers import (
    cli,
    jobs_by_id,
    queue_add,
    rounds_after,
    start_lab,
    wait_jobs,
    wait_until,
)
from helpers.sinks import HookSink

LONG = "#!/bin/sh\nsleep 600\n"


@pytest.fixture
def idle_lab(sshd_cluster, tmp_path):
    def make(hook: HookSink, action: str, util: int, gpus: int = 1):
        cluster = sshd_cluster(1)
        next(iter(cluster.nodes.values())).set_fake(gpus=gpus, util=util)
        inventory = tmp_path / "nodes.yaml"
        inventory.write_text(
            f"lab:\n  poll_interval: 0.3\n  node_grace: 30\n  idle_after: 2\n"
            f"  idle_action: {action}\n  notify:\n    webhook: {hook.url}\n"
            + cluster.inventory_yaml())
        ctl = start_lab(cluster, tmp_path, inventory)
        made.append(ctl)
        return ctl
    made: list = []
    yield make
    for ctl in made:
        ctl.stop()


def _idle_notices(hook: HookSink, job_id: int) -> list[dict]:
    return [b for b in hook.got()[1] if b.get("event") == "idle" and b["job"]["id"] == job_id]


def _events(home, job_id: int) -> list[dict]:
    return json.loads(cli(home, "queue", "show", str(job_id), "--json", check=True).stdout
                      )["events"]


def test_an_idle_job_is_marked_told_once_and_requeued_exactly_once(idle_lab, tmp_path):
    script = tmp_path / "long.sh"
    script.write_text(LONG)
    with HookSink() as hook:
        ctl = idle_lab(hook, "requeue", util=0)
        home = ctl.home
        submitted = time.time()
        job = queue_add(home, str(script), "--name", "holder")
        wait_until(lambda: _idle_notices(hook, job), limit=120)
        first = _idle_notices(hook, job)[0]
        assert first["text"].startswith(f"Job {job} (holder) of ")
        assert "idle: GPU node01:0 at or below 5% for " in first["text"]
        # stopped and queued again, then running its second attempt, idle again: only told
        jobs = wait_jobs(home, lambda js: js[job]["attempts"] == 2
                         and js[job]["state"] == "running"
                         and js[job]["reason"].startswith("idle:"), timeout=180)
        assert jobs[job]["reason"].endswith("s")          # "... for 2s": no action this time
        assert "requeue" not in jobs[job]["reason"]
        wait_until(lambda: len(_idle_notices(hook, job)) == 2, limit=60)
        moves = [(e["old_state"], e["new_state"]) for e in _events(home, job)]
        assert moves.count(("lost", "queued")) == 1              # requeued exactly once
        assert moves.count(("running", "running")) == 2          # marked once per attempt
        status = cli(home, "status", check=True).stdout
        assert f"#{job} " in status and " IDLE" in status
        listed = cli(home, "queue", "list", check=True).stdout
        assert "idle: GPU node01:0" in listed
        why = cli(home, "queue", "why", str(job), check=True).stdout
        assert why.startswith(f"job {job} is running: idle: GPU node01:0 at or below 5% for ")
        assert jobs_by_id(home)[job]["state"] == "running"       # not stopped a second time
        assert len(_idle_notices(hook, job)) == 2                # one a spell, not one a poll
        # the idle GPU-hours per user (metrics): counted between idle polls, one GPU
        with sqlite3.connect(home / "iadeep.db") as db:
            row = db.execute("SELECT value FROM meta WHERE key='idle_gpu_seconds'").fetchone()
        wasted = json.loads(row[0])
        owner = jobs_by_id(home)[job]["user"]
        assert set(wasted) == {owner} and 2.0 <= wasted[owner] <= time.time() - submitted


def test_cancel_stops_an_idle_job_but_not_a_patient_or_a_busy_one(idle_lab, tmp_path):
    script = tmp_path / "long.sh"
    script.write_text(LONG)
    with HookSink() as hook:
        ctl = idle_lab(hook, "cancel", util=0, gpus=2)
        home = ctl.home
        job = queue_add(home, str(script), "--exclusive")
        patient = queue_add(home, str(script), "--exclusive", "--idle-after", "1h")
        jobs = wait_jobs(home, lambda js: js[job]["state"] == "cancelled", timeout=120)
        assert jobs[job]["reason"] == "cancelled for idleness (lab.idle_action)"
        wait_until(lambda: _idle_notices(hook, job), limit=60)
        started = wait_jobs(home, lambda js: js[patient]["state"] == "running")[patient][
            "started_at"]
        rounds_after(home, started + 6)         # idle three times the lab's idle_after
        jobs = jobs_by_id(home)
        assert jobs[patient]["state"] == "running"
        assert not jobs[patient]["reason"].startswith("idle")   # its own --idle-after: 1h
        # the same node reporting its GPUs busy: a job running past idle_after is left alone
        next(iter(ctl.cluster.nodes.values())).set_fake(gpus=2, util=60)
        busy = queue_add(home, str(script), "--exclusive")
        started = wait_jobs(home, lambda js: js[busy]["state"] == "running")[busy]["started_at"]
        rounds_after(home, started + 6)
        jobs = jobs_by_id(home)
        assert jobs[busy]["state"] == "running" and not jobs[busy]["reason"].startswith("idle")
        assert not _idle_notices(hook, busy) and not _idle_notices(hook, patient)
        assert " IDLE" not in cli(home, "status", check=True).stdout

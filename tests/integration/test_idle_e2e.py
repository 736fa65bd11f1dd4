"""Idle GPU holders end to end: a real sshd node whose stand-in nvidia-smi reports its GPU at
0 % (or busy), a real controller process, a real webhook sink. A job that holds an idle GPU past
``idle_after`` is marked idle (`queue list`, `queue why`, `queue show`), its owner is told once
per attempt, and ``idle_action: requeue`` puts it back in the queue exactly once.
"""
from __future__ import annotations

import json

import pytest

from helpers.controllers import cli, jobs_by_id, start_lab, wait_jobs, wait_until
from helpers.sinks import HookSink

LONG = "#!/bin/sh\nsleep 600\n"


@pytest.fixture
def idle_lab(sshd_cluster, tmp_path):
    def make(hook: HookSink, action: str, util: int):
        cluster = sshd_cluster(1)
        next(iter(cluster.nodes.values())).set_fake(gpus=1, util=util)
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
        job = int(cli(home, "queue", "add", str(script), "--name", "holder",
                      check=True).stdout)
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
        listed = cli(home, "queue", "list", check=True).stdout
        assert "idle: GPU node01:0" in listed
        why = cli(home, "queue", "why", str(job), check=True).stdout
        assert why.startswith(f"job {job} is running: idle: GPU node01:0 at or below 5% for ")
        assert jobs_by_id(home)[job]["state"] == "running"       # not stopped a second time
        assert len(_idle_notices(hook, job)) == 2                # one a spell, not one a poll


def test_a_busy_job_is_not_idle_and_cancel_stops_an_idle_one(idle_lab, tmp_path):
    script = tmp_path / "long.sh"
    script.write_text(LONG)
    with HookSink() as hook:
        ctl = idle_lab(hook, "cancel", util=0)
        home = ctl.home
        job = int(cli(home, "queue", "add", str(script), check=True).stdout)
        jobs = wait_jobs(home, lambda js: js[job]["state"] == "cancelled", timeout=120)
        assert jobs[job]["reason"] == "cancelled by iadeep:idle"
        wait_until(lambda: _idle_notices(hook, job), limit=60)
        # the same node reporting its GPU busy: a job running past idle_after is left alone
        next(iter(ctl.cluster.nodes.values())).set_fake(gpus=1, util=60)
        busy = int(cli(home, "queue", "add", str(script), check=True).stdout)
        started = wait_jobs(home, lambda js: js[busy]["state"] == "running")[busy]["started_at"]
        later = wait_until(lambda: (lambda s: s if s["controller"]["heartbeat_at"]
                                    > started + 6 else None)(json.loads(
                                        cli(home, "status", "--json", check=True).stdout)),
                           limit=120)
        assert later
        jobs = jobs_by_id(home)
        assert jobs[busy]["state"] == "running" and not jobs[busy]["reason"].startswith("idle")
        assert not _idle_notices(hook, busy)

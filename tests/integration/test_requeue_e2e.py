"""Requeueable jobs end to end: a real sshd node, a real controller process, the real CLI.

A ``--requeue`` job is a shell job that keeps its step in a file of its working directory and
exits when it gets its checkpoint signal. Requeued (``queue requeue``: its owner's or an
admin's), it is signalled once, checkpoints, goes back to the queue without spending a retry,
starts again (told so by ``IADEEP_RESTART_COUNT``) and resumes at the step it saved: every
step is done exactly once over its attempts. One that ignores the signal is stopped when the
lab's ``preempt_grace`` ends and requeued all the same.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.controllers import cli, fake_gpu_lab, jobs_by_id, queue_add, wait_jobs, wait_until

STEPS = 40
HOLD_AT = 5   # it waits at this step until the test lets it go on (./go)


def _stepper(tmp_path: Path, on_signal: str) -> str:
    """A job that counts to STEPS, each step appended to steps.log and kept in ./step (its
    checkpoint); at step HOLD_AT it waits (./started) until ./go exists; on USR1 it runs
    ``on_signal``. What it says goes to its output and, over all attempts, to ./said."""
    script = tmp_path / "stepper.sh"
    script.write_text(f"""#!/bin/sh
say() {{ echo "$1"; echo "$1" >> said; }}
step=0
[ -f step ] && step=$(cat step)
say "start at step $step, restart ${{IADEEP_RESTART_COUNT:-unset}}"
trap '{on_signal}' USR1
while [ "$step" -lt {STEPS} ]; do
  if [ "$step" -ge {HOLD_AT} ] && [ ! -f go ]; then touch started; sleep 0.1; continue; fi
  step=$((step + 1))
  echo "$step" >> steps.log
  echo "$step" > step
  sleep 0.05
done
say done
""")
    script.chmod(0o755)
    return str(script)


SAVE_AND_EXIT = 'echo "$step" > step; say "checkpointed at step $step"; exit 0'


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, lab="node_grace: 30\nkill_grace: 2\n"
                      "policy: {preempt_grace: 3}") as ctl:
        yield ctl


def _work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def test_a_requeued_job_checkpoints_restarts_and_resumes_without_spending_a_retry(lab,
                                                                                  tmp_path):
    home = lab.home
    work = _work(tmp_path)
    job = queue_add(home, _stepper(tmp_path, SAVE_AND_EXIT), "--requeue", "--retries", "0",
                    "--chdir", str(work))
    wait_until(lambda: (work / "started").exists(), limit=120)
    assert "requeueing" in cli(home, "queue", "requeue", str(job), check=True).stdout
    jobs = wait_jobs(home, lambda js: js[job].get("checkpoints") == 1)
    assert int((work / "step").read_text()) == HOLD_AT   # saved where it was
    (work / "go").touch()
    jobs = wait_jobs(home, lambda js: js[job]["state"] in ("succeeded", "failed"), timeout=180)
    assert jobs[job]["state"] == "succeeded"
    assert (jobs[job]["attempts"], jobs[job]["checkpoints"]) == (2, 1)   # no retry spent
    # every step done once over both attempts: resumed where it saved, nothing redone
    assert (work / "steps.log").read_text().split() == [str(i) for i in range(1, STEPS + 1)]
    assert (work / "said").read_text().splitlines() == [
        "start at step 0, restart 0", f"checkpointed at step {HOLD_AT}",
        f"start at step {HOLD_AT}, restart 1", "done"]
    assert cli(home, "logs", str(job), check=True).stdout == \
        f"start at step {HOLD_AT}, restart 1\ndone\n"   # the attempt's own output
    detail = json.loads(cli(home, "queue", "show", str(job), "--json", check=True).stdout)
    moves = [(e["old_state"], e["new_state"]) for e in detail["events"]]
    assert moves.count(("queued", "starting")) == 2 and moves.count(("running", "queued")) == 1
    reasons = [e["reason"] for e in detail["events"]]
    assert sum("SIGUSR1 sent" in r for r in reasons) == 1
    assert any(r.startswith("checkpointed on SIGUSR1 (exit code 0); requeued by ")
               and "no retry spent" in r for r in reasons)
    assert "preempted" not in detail   # said while it waited; placed again, its events keep it


def test_a_job_that_ignores_its_signal_is_stopped_after_the_grace_and_still_requeued(lab,
                                                                                     tmp_path):
    home = lab.home
    work = _work(tmp_path)
    job = queue_add(home, _stepper(tmp_path, 'say "ignoring USR1 at step $step"'),
                    "--requeue", "--chdir", str(work))
    wait_until(lambda: (work / "started").exists(), limit=120)
    cli(home, "queue", "requeue", str(job), check=True)
    jobs = wait_jobs(home, lambda js: js[job].get("checkpoints") == 1)
    assert jobs[job]["state"] in ("queued", "starting", "running")
    (work / "go").touch()
    jobs = wait_jobs(home, lambda js: js[job]["state"] in ("succeeded", "failed"), timeout=180)
    assert jobs[job]["state"] == "succeeded"
    assert (jobs[job]["attempts"], jobs[job]["checkpoints"], jobs[job]["retries"]) == (2, 1, 0)
    assert (work / "said").read_text().splitlines() == [
        "start at step 0, restart 0", f"ignoring USR1 at step {HOLD_AT}",
        f"start at step {HOLD_AT}, restart 1", "done"]
    # it kept its step as it went, so the restart resumed where it was stopped
    assert (work / "steps.log").read_text().split() == [str(i) for i in range(1, STEPS + 1)]
    events = json.loads(cli(home, "queue", "show", str(job), "--json", check=True).stdout)[
        "events"]
    assert any(e["new_state"] == "queued" and e["reason"].startswith("checkpointed on SIGUSR1 ")
               for e in events), events


def test_a_job_without_requeue_cannot_be_requeued(lab, tmp_path):
    home = lab.home
    work = _work(tmp_path)
    job = queue_add(home, _stepper(tmp_path, SAVE_AND_EXIT), "--chdir", str(work))
    wait_until(lambda: (work / "started").exists(), limit=120)
    refused = cli(home, "queue", "requeue", str(job))
    assert refused.returncode == 1
    assert f"job {job} was not submitted with --requeue" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert jobs_by_id(home)[job]["state"] == "running"
    cli(home, "queue", "cancel", str(job), check=True)
    jobs = wait_jobs(home, lambda js: js[job]["state"] == "cancelled")
    assert jobs[job].get("checkpoints") is None and jobs[job]["attempts"] == 1


def test_a_requeue_survives_a_controller_kill_and_signals_the_job_once(lab, tmp_path):
    """SIGKILL the controller right after `queue requeue` answered (the intent is committed;
    the signal may or may not be out yet): the next controller finishes the requeue, and the
    job got its signal at most once (a signal lost with the controller is made up for by the
    grace: it is stopped and requeued, never signalled twice), was requeued once and started
    twice, resuming at its step."""
    home = lab.home
    work = _work(tmp_path)
    job = queue_add(home, _stepper(tmp_path, SAVE_AND_EXIT), "--requeue", "--chdir", str(work))
    wait_until(lambda: (work / "started").exists(), limit=120)
    cli(home, "queue", "requeue", str(job), check=True)
    lab.kill()
    lab.start()
    jobs = wait_jobs(home, lambda js: js[job].get("checkpoints") == 1)
    (work / "go").touch()
    jobs = wait_jobs(home, lambda js: js[job]["state"] in ("succeeded", "failed"), timeout=180)
    assert jobs[job]["state"] == "succeeded"
    assert (jobs[job]["attempts"], jobs[job]["checkpoints"]) == (2, 1)
    said = (work / "said").read_text().splitlines()
    detail = json.loads(cli(home, "queue", "show", str(job), "--json", check=True).stdout)
    [requeued] = [e["reason"] for e in detail["events"]
                  if e["reason"].startswith("checkpointed on SIGUSR1 (exit code ")]
    if f"checkpointed at step {HOLD_AT}" in said:   # the signal was out before the kill
        assert requeued.startswith("checkpointed on SIGUSR1 (exit code 0)"), requeued
        assert said == ["start at step 0, restart 0", f"checkpointed at step {HOLD_AT}",
                        f"start at step {HOLD_AT}, restart 1", "done"]
    else:   # lost with the controller: stopped after the grace, not signalled again
        assert not requeued.startswith("checkpointed on SIGUSR1 (exit code 0)"), requeued
        assert said == ["start at step 0, restart 0", f"start at step {HOLD_AT}, restart 1",
                        "done"]
    assert (work / "steps.log").read_text().split() == [str(i) for i in range(1, STEPS + 1)]

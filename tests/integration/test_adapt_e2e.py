"""Run-time adaptation end to end: a real sshd node, a real controller process, the real CLI,
and stand-in jobs whose progress really slows while they share their GPU
(``helpers/contention.py``: two together run at 0.25 + 0.25 of their solo speed).

The controller must find the pair worse than serial, suspend the job that joined last (its
processes really stopped) and resume it when its partner ends; SIGKILLed right after it
committed the suspension, and again around the resumption, it loses nothing, starts nothing
twice and leaves nothing stopped.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from helpers.adapt_lab import EMULATOR, emulator_lab
from helpers.controllers import (
    attempt_processes,
    cli,
    jobs_by_id,
    process_states,
    queue_add,
    wait_jobs,
)


def _all_stopped(job_id: int, node: str, home: Path) -> bool:
    return process_states(attempt_processes(job_id, node, home)) == {"T"}


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    # every action on (suspending and closing GPUs are off by default)
    with emulator_lab(sshd_cluster, tmp_path, "{observe_s: 0, polls: 3, window_s: 1.0, "
                      "suspend: true, stop_partners: true}") as ctl:
        yield ctl


def _emulator_job(tmp_path: Path, iters: int, checkpoint: str = "") -> str:
    script = tmp_path / f"emu-{iters}.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {EMULATOR} {tmp_path / 'gpu0'} "
                      f"{iters} {checkpoint}\n")
    script.chmod(0o755)
    return str(script)


def test_a_harmful_pair_is_suspended_and_resumed_through_controller_kills(lab, tmp_path):
    home, node = lab.home, lab.node
    # the partner runs until the test ends it: a partner that finished on its own could end
    # while a loaded machine restarts the controller, and the suspended job would rightly resume
    first = queue_add(home, _emulator_job(tmp_path, 10**6), "--workload", "emu")
    wait_jobs(home, lambda js: js[first]["observed_speed"] is not None)
    second = queue_add(home, _emulator_job(tmp_path, 300), "--workload", "emu")
    jobs = wait_jobs(home, lambda js: js[second]["state"] == "suspended")
    # SIGKILL as soon as the suspension is committed: its SIGSTOP may or may not be out yet
    lab.kill()
    assert jobs[first]["state"] == "running" and jobs[second]["node"] == jobs[first]["node"]
    lab.start()
    # the restarted controller makes sure the job is stopped (its partner still runs)
    deadline = time.monotonic() + 60
    while not _all_stopped(second, node, home):
        assert time.monotonic() < deadline, process_states(attempt_processes(second, node, home))
        time.sleep(0.1)
    assert jobs_by_id(home)[second]["state"] == "suspended"
    why = cli(home, "queue", "why", str(second), check=True).stdout
    assert why.startswith(f"job {second} is suspended: suspended: {node}:0 ")
    assert "speeds sum to" in why and f"resumed when job {first} leaves {node}:0" in why
    shown = cli(home, "queue", "show", str(first), check=True).stdout
    assert "adapt:" in shown and "no new partners join it" in shown
    # the partner ends; kill the controller again while the resumption is due or under way
    cli(home, "queue", "cancel", str(first), check=True)
    wait_jobs(home, lambda js: js[first]["state"] == "cancelled")
    lab.kill()
    lab.start()
    jobs = wait_jobs(home, lambda js: js[second]["state"] in ("succeeded", "failed"))
    assert jobs[second]["state"] == "succeeded" and jobs[second]["exit_code"] == 0
    assert jobs[first]["attempts"] == jobs[second]["attempts"] == 1
    assert jobs[second]["suspended_s"] > 0
    detail = json.loads(cli(home, "queue", "show", str(second), "--json", check=True).stdout)
    moves = [(e["old_state"], e["new_state"]) for e in detail["events"]]
    assert moves.count(("queued", "starting")) == 1          # started once
    assert ("running", "suspended") in moves and ("suspended", "running") in moves
    assert cli(home, "logs", str(second), check=True).stdout.count("done") == 1
    assert attempt_processes(second, node, home) == []          # nothing left stopped


def test_a_checkpointing_job_requeues_and_resumes_through_a_controller_kill(lab, tmp_path):
    """--checkpoint-signal USR1 with --chdir: SIGKILL the controller while the job saves its
    checkpoint (it got its USR1, it has not exited): the next controller finds it exited, with
    the checkpoint marked in the database, and requeues it once; it waits for its old partner
    to leave (known from the database, not from the dead controller's memory), starts again
    once and resumes from its checkpoint."""
    home = lab.home
    work = tmp_path / "work"
    work.mkdir()
    (work / "ckpt.hold").touch()   # its save lasts until the controller has been killed
    first = queue_add(home, _emulator_job(tmp_path, 2000), "--workload", "emu")
    wait_jobs(home, lambda js: js[first]["observed_speed"] is not None)
    second = queue_add(home, _emulator_job(tmp_path, 400, "ckpt"), "--workload",
                       "emu", "--checkpoint-signal", "USR1", "--chdir", str(work))
    # the job got its USR1 and is saving (held there): the controller dies mid-action
    deadline = time.monotonic() + 120
    while not (work / "ckpt.saving").exists():
        assert time.monotonic() < deadline, jobs_by_id(home)[second]
        time.sleep(0.02)
    lab.kill()
    assert jobs_by_id(home)[second]["reason"].startswith("checkpoint: ")   # read offline
    (work / "ckpt.hold").unlink()
    lab.start()
    jobs = wait_jobs(home, lambda js: js[second].get("checkpoints") == 1)
    # requeued, not failed (on a loaded machine its short second attempt may be over already)
    assert jobs[second]["state"] in ("queued", "starting", "running", "succeeded")
    saved = int((work / "ckpt").read_text())
    assert saved > 0
    jobs = wait_jobs(home, lambda js: js[second]["state"] in ("succeeded", "failed"), timeout=180)
    assert jobs[second]["state"] == "succeeded" and jobs[first]["state"] == "succeeded"
    assert (jobs[second]["attempts"], jobs[second]["checkpoints"]) == (2, 1)
    assert jobs[first]["attempts"] == 1
    detail = json.loads(cli(home, "queue", "show", str(second), "--json", check=True).stdout)
    moves = [(e["old_state"], e["new_state"]) for e in detail["events"]]
    assert moves.count(("queued", "starting")) == 2 and ("running", "queued") in moves
    starts = [e["at"] for e in detail["events"] if e["new_state"] == "starting"]
    first_end = json.loads(cli(home, "queue", "show", str(first), "--json",
                               check=True).stdout)["ended_at"]
    assert starts[1] >= first_end   # not back next to its old partner
    log = cli(home, "logs", str(second), check=True).stdout
    assert f"resumed from {saved}" in log and log.count("done") == 1


def test_an_opportunistic_job_yields_to_a_regular_one_through_a_controller_kill(lab, tmp_path):
    """An exclusive --opportunistic job holds the only GPU; a regular job arrives: the
    opportunistic job is suspended in place (SIGKILL of the controller as soon as that is
    committed), the regular job runs there, and the opportunistic job resumes after it (and is
    then cancelled, still cancellable); each started once."""
    home, node = lab.home, lab.node
    opp = queue_add(home, _emulator_job(tmp_path, 10**6), "--workload", "emu",
                    "--opportunistic", "--exclusive")
    wait_jobs(home, lambda js: js[opp]["state"] == "running")
    regular = queue_add(home, _emulator_job(tmp_path, 600), "--workload", "emu")
    jobs = wait_jobs(home, lambda js: js[opp]["state"] == "suspended")
    lab.kill()
    assert jobs[opp]["reason"] == (f"suspended: opportunistic: regular job {regular} waits "
                                   f"for {node}:0; resumed when it leaves")
    lab.start()
    deadline = time.monotonic() + 60
    while not _all_stopped(opp, node, home) and jobs_by_id(home)[regular]["state"] != "succeeded":
        assert time.monotonic() < deadline, process_states(attempt_processes(opp, node, home))
        time.sleep(0.1)
    jobs = wait_jobs(home, lambda js: js[regular]["state"] in ("succeeded", "failed"))
    assert jobs[regular]["state"] == "succeeded" and jobs[regular]["node"] == node
    wait_jobs(home, lambda js: js[opp]["state"] == "running")
    deadline = time.monotonic() + 30   # resumed: running, and really continued
    while "T" in process_states(attempt_processes(opp, node, home)):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cli(home, "queue", "cancel", str(opp), check=True)
    jobs = wait_jobs(home, lambda js: js[opp]["state"] == "cancelled")
    assert jobs[opp]["attempts"] == jobs[regular]["attempts"] == 1
    detail = json.loads(cli(home, "queue", "show", str(opp), "--json", check=True).stdout)
    moves = [(e["old_state"], e["new_state"]) for e in detail["events"]]
    assert moves == [(None, "queued"), ("queued", "starting"), ("starting", "running"),
                     ("running", "suspended"), ("suspended", "running"),
                     ("running", "cancelled")]
    assert attempt_processes(opp, node, home) == []

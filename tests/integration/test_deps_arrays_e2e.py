"""Dependencies and arrays end to end: real sshd nodes, a real controller process (SIGKILLed in
the middle), the CLI. Every wait is on a condition, with a timeout; nothing is timed."""
import json
import signal
import time
from pathlib import Path

import pytest

from helpers.controllers import cli, fake_gpu_lab, jobs_by_id, queue_add, wait_until

ACTIVE = {"starting", "running"}
FINISHED = {"succeeded", "failed", "cancelled", "timeout"}


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, nodes=2, gpus=2, lab="node_grace: 30") as ctl:
        yield ctl


def add_exclusive(home: Path, *args: str) -> int:
    return queue_add(home, *args, "--exclusive")


def _restart(lab) -> None:
    lab.kill(signal.SIGKILL)
    lab.start()


def test_a_chain_waits_for_success_cancels_on_failure_and_survives_sigkill(lab, tmp_path):
    home, go, marks = lab.home, tmp_path / "go", tmp_path / "starts"
    ok, bad = tmp_path / "ok.sh", tmp_path / "bad.sh"
    for path, code in ((ok, 0), (bad, 3)):
        path.write_text(f"#!/bin/sh\necho $IADEEP_JOB_ID >> {marks}\n"
                        f"while [ ! -e {go} ]; do sleep 0.1; done\nexit {code}\n")
    a = add_exclusive(home, str(ok))
    b = add_exclusive(home, str(ok), "--after", str(a))
    c = add_exclusive(home, str(bad))
    d = add_exclusive(home, str(ok), "--after", str(c))
    wait_until(lambda: all(jobs_by_id(home)[i]["state"] == "running" for i in (a, c)), 60, 0.3)
    _restart(lab)                                   # mid-chain: A and C run, B and D wait
    # B's and D's reasons name their dependencies' states as a round last saw them: one from
    # before A and C were seen running ("(starting)") may still be there after the restart,
    # until the new controller's first round rewrites them
    jobs = wait_until(lambda: (js := jobs_by_id(home))[b]["reason"] ==
                      f"waiting for job {a} (running)" and js[d]["reason"] ==
                      f"waiting for job {c} (running)" and js, 120, 0.3)
    assert jobs[b]["state"] == jobs[d]["state"] == "queued"
    why = cli(home, "queue", "why", str(d), check=True).stdout.splitlines()
    assert why[0] == f"job {d} is queued: waiting for job {c} (running)"
    assert why[1].startswith("expected run time ~")   # placement's estimate
    assert why[2].startswith("label ok.sh@") and len(why) == 3, why   # its program's label
    go.touch()
    jobs = wait_until(lambda: (js := jobs_by_id(home)) and all(
        js[i]["state"] in FINISHED for i in (a, b, c, d)) and js, 90, 0.3)
    assert [jobs[i]["state"] for i in (a, b, c, d)] == \
        ["succeeded", "succeeded", "failed", "cancelled"]
    assert jobs[d]["reason"] == f"dependency {c} failed"
    assert jobs[b]["started_at"] >= jobs[a]["ended_at"]
    assert sorted(map(int, marks.read_text().split())) == [a, b, c]   # each once, D never


def test_an_array_runs_each_index_once_at_most_its_limit_at_once_through_sigkill(lab, tmp_path):
    home, marks, go = lab.home, tmp_path / "indices", tmp_path / "go"
    script = tmp_path / "task.sh"
    # tasks 0 and 1 end at once; the others wait for `go`, so the kill lands mid-array
    script.write_text(f"#!/bin/sh\necho $IADEEP_ARRAY_JOB_ID $IADEEP_ARRAY_INDEX >> {marks}\n"
                      f"[ $IADEEP_ARRAY_INDEX -lt 2 ] || while [ ! -e {go} ]; do sleep 0.1; "
                      "done\n")
    array = add_exclusive(home, str(script), "--array", "0-5%2")
    most, killed = 0, False
    deadline = time.monotonic() + 120
    while True:                                  # sample the running tasks throughout
        jobs = json.loads(cli(home, "queue", "list", "--all", "--json", check=True).stdout)
        tasks = [j for j in jobs if j.get("array_id") == array]
        assert len(tasks) == 6
        running = sum(j["state"] in ACTIVE for j in tasks)
        most = max(most, running)
        done = sum(j["state"] == "succeeded" for j in tasks)
        if not killed and done == 2 and running == 2:
            _restart(lab)                        # mid-array: two done, two running, two queued
            killed = True
            go.touch()
        if all(j["state"] in FINISHED for j in tasks):
            break
        assert time.monotonic() < deadline, json.dumps(tasks, indent=1)
    assert killed and most == 2
    assert [j["state"] for j in tasks] == ["succeeded"] * 6
    assert sorted(marks.read_text().splitlines()) == [f"{array} {i}" for i in range(6)]

"""Forecasts end to end: real sshd nodes, a real controller process, the CLI. A scenario whose
answer is known: one GPU, a job running that its --time stops, a second job waiting for the
GPU; the second is forecast to start when the first reaches its --time, and does, within the
range the forecast gave. Every wait is on a condition, with a timeout; nothing is timed."""
import json
import subprocess

import pytest

from helpers.controllers import (
    IADEEP,
    cli,
    env_for,
    fake_gpu_lab,
    jobs_by_id,
    queue_add,
    wait_until,
)
from iadeep_cli.paths import StateDir
from iadeep_cli.text import moment


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, nodes=1, gpus=1) as ctl:
        yield ctl


def show(home, job_id: int) -> dict:
    return json.loads(cli(home, "queue", "show", str(job_id), "--json", check=True).stdout)


def test_a_waiting_job_starts_within_the_range_its_forecast_gave(lab, tmp_path):
    """The second job is `iadeep run`'s: its waiting line carries the forecast too."""
    home, script = lab.home, tmp_path / "long.sh"
    script.write_text("#!/bin/sh\nexec sleep 1000\n")
    first = queue_add(home, str(script), "--time", "0:20", "--exclusive")   # 20 seconds
    wait_until(lambda: jobs_by_id(home)[first]["state"] == "running", 60, 0.2)
    err = tmp_path / "run.err"
    with open(err, "wb") as to:   # not a terminal: a line per change of the waiting line
        run = subprocess.Popen([*IADEEP, "run", "--time", "0:20", "--exclusive", "--",
                                "sleep", "1000"], env=env_for(home),
                               stdout=subprocess.DEVNULL, stderr=to)
    try:
        line = wait_until(lambda: next((x for x in err.read_text().splitlines()
                                        if "; expected to start ~" in x), None), 60, 0.2)
    finally:
        run.kill()                # the client only; its job stays queued
        run.wait()
    second = int(err.read_text().splitlines()[0].split()[3])   # iadeep run: job N submitted
    assert line.startswith(f"job {second} queued: #1 of 1 waiting: "), line
    detail = wait_until(lambda: (d := show(home, second)).get("forecast") and d, 60, 0.2)
    ahead = detail["forecast"]
    said = line.split("; expected to start ~", 1)[1][:5]      # HH:MM, today
    assert moment(ahead["start_low"], ahead["start_low"]) <= said <= \
        moment(ahead["start_high"], ahead["start_high"]), (line, ahead)
    assert "; ends ~" in line, line
    began = jobs_by_id(home)[first]["started_at"]
    # the first job stops at its --time: the second is expected then, on the one GPU
    assert ahead["start_low"] == pytest.approx(began + 20, abs=1.0)
    assert ahead["start_low"] <= ahead["start"] <= ahead["start_high"]
    assert (ahead["node"], ahead["gpus"]) == (next(iter(lab.cluster.nodes)), [0])
    why = cli(home, "queue", "why", str(second), check=True).stdout.splitlines()
    assert any(line.startswith("expected to start ~") and " on " in line and "; ends ~" in line
               for line in why), why
    listed = {j["id"]: j for j in json.loads(cli(home, "queue", "list", "--json",
                                                 check=True).stdout)}
    assert listed[second]["expected_start"] == pytest.approx(ahead["start"], abs=30)
    assert "EXPECTED START" in cli(home, "queue", "list", "--wide", check=True).stdout
    jobs = wait_until(lambda: (js := jobs_by_id(home))[second]["started_at"] is not None and js,
                      90, 0.2)
    assert jobs[first]["state"] == "timeout"
    started = jobs[second]["started_at"]
    assert ahead["start_low"] <= started <= ahead["start_high"], (
        began, ahead, started, jobs[first]["ended_at"])


def test_test_only_says_when_a_job_would_start_and_queues_nothing(lab, tmp_path):
    home, script = lab.home, tmp_path / "long.sh"
    script.write_text("#!/bin/sh\nexec sleep 1000\n")
    scripts = StateDir(home).scripts
    # (until its node has answered a round, the controller truly says it would wait)
    out = wait_until(lambda: (p := cli(home, "queue", "add", "--test-only", str(script),
                                       "--exclusive")).returncode == 0
                     and p.stdout.startswith("the job would start now") and p.stdout, 60, 0.3)
    assert out.startswith("the job would start now on ") and "nothing queued" in out, out
    assert jobs_by_id(home) == {}   # no job row
    first = queue_add(home, str(script), "--time", "0:30", "--exclusive")
    wait_until(lambda: jobs_by_id(home)[first]["state"] == "running", 60, 0.2)
    out = wait_until(lambda: "would wait" in (p := cli(home, "queue", "add", "--test-only",
                                                       str(script), "--exclusive",
                                                       check=True)).stdout and p.stdout, 60, 0.3)
    lines = out.splitlines()
    assert lines[0].startswith("the job would wait: "), out
    assert lines[1].startswith("expected to start ~"), out
    assert lines[-1] == "(test only: nothing queued)"
    assert list(jobs_by_id(home)) == [first]   # still only the one job
    # and no script copy of a job that was never queued
    assert sorted(p.name for p in scripts.iterdir()) == [str(first)]

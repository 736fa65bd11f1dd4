"""End to end: real sshd nodes, the stand-in nvidia-smi, a real controller process, the CLI.

Jobs are the shipped examples in jobs/; the controller places, launches and finishes them, and
survives SIGKILL and node loss without losing or duplicating a job.
"""
import json
import os
import pwd
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers.controllers import (
    IADEEP,
    ControllerProcess,
    attempt_processes,
    cli,
    env_for,
    jobs_by_id,
    queue_add,
    start_lab,
    wait_jobs,
    wait_until,
)
from iadeep_cli.jobs import program_label

ROOT = Path(__file__).resolve().parents[2]
FINISHED = {"succeeded", "failed", "cancelled"}


def _inventory(cluster, tmp_path, gpus=1, grace=3.0):
    for node in cluster.nodes.values():
        node.set_fake(gpus=gpus)
    path = tmp_path / "nodes.yaml"
    path.write_text(f"lab:\n  poll_interval: 0.3\n  node_grace: {grace}\n" +
                    cluster.inventory_yaml())
    return path


_jobs = jobs_by_id


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    ctl = start_lab(cluster, tmp_path, _inventory(cluster, tmp_path))
    yield ctl
    ctl.stop()


def test_jobs_run_to_completion_with_exact_arguments(lab, tmp_path):
    home = lab.home
    nasty = ["it's", '$(touch /tmp/pwned)', "a;b", "two words", "line\nbreak", '"q"']
    hello = queue_add(home, str(ROOT / "jobs/hello.sh"), *nasty, "--env", "GREETING=$(id) ;x",
                      "--env", "SLEEP_S=0", "--name", "hello `uname`")
    steps = queue_add(home, str(ROOT / "jobs/steps_progress.sh"), "5", "0.05", "--workload", "mlp")
    bad = tmp_path / "fails.sh"
    bad.write_text("#!/bin/sh\necho about to fail\nexit 3\n")
    failing = queue_add(home, str(bad))
    jobs = wait_jobs(home, lambda js: all(j["state"] in FINISHED for j in js.values()))
    assert (jobs[hello]["state"], jobs[hello]["exit_code"]) == ("succeeded", 0)
    assert (jobs[steps]["state"], jobs[steps]["exit_code"]) == ("succeeded", 0)
    assert (jobs[failing]["state"], jobs[failing]["exit_code"]) == ("failed", 3)
    assert all(j["node"] in lab.cluster.nodes for j in jobs.values())
    out = cli(home, "logs", str(hello), check=True).stdout
    for i, arg in enumerate(nasty, 1):
        assert f"arg {i}: {arg}\n" in out
    assert "GREETING=$(id) ;x\n" in out
    assert not Path("/tmp/pwned").exists()
    assert cli(home, "logs", str(failing), check=True).stdout == "about to fail\n"
    from iadeep_cli.controller import client
    head = client.call("logs", {"id": hello, "offset": 0, "max_bytes": 10},
                       socket_path=home / "controller.sock")
    assert head["data"] == out[:10] and head["offset"] == 10
    assert head["size"] == len(out.encode()) and head["finished"]
    events = json.loads(cli(home, "queue", "show", str(failing), "--json").stdout)["events"]
    assert [e["new_state"] for e in events] == ["queued", "starting", "running", "failed"]

    def healthy():
        # a round may end before a node's poll answered (a loaded machine): that is said as
        # "its poll is still running" and the answer is used by a later round
        status = json.loads(cli(home, "status", "--json", check=True).stdout)
        nodes_ok = all(n["error"] is None and len(n["gpus"]) == 1 for n in status["nodes"])
        return status if nodes_ok else None

    status = wait_until(healthy, limit=120)
    assert status["live"] and {n["name"] for n in status["nodes"]} == set(lab.cluster.nodes)


def test_cancel_a_running_job_stops_it_on_its_node(lab):
    home = lab.home
    job = queue_add(home, str(ROOT / "jobs/steps_progress.sh"), "600", "0.1")
    wait_jobs(home, lambda js: js[job]["state"] == "running")
    assert cli(home, "queue", "cancel", str(job), check=True).stdout.strip() == \
        f"job {job}: cancelling"
    jobs = wait_jobs(home, lambda js: js[job]["state"] in FINISHED, timeout=120)
    assert jobs[job]["state"] == "cancelled"


def _marker_script(tmp_path, seconds):
    """A job that appends its id to a file once per start: proof it ran exactly once."""
    marks = tmp_path / "starts.log"
    script = tmp_path / "marked.sh"
    script.write_text(f"#!/bin/sh\necho $IADEEP_JOB_ID >> {marks}\nsleep {seconds}\n")
    return script, marks


def test_sigkill_while_jobs_start_and_run_loses_and_duplicates_nothing(lab, tmp_path):
    home = lab.home
    script, marks = _marker_script(tmp_path, 1.5)
    ids = [queue_add(home, str(script), "--name", f"m{i}", "--workload", "mlp") for i in range(6)]
    for _ in range(3):  # kill it mid-flight a few times, at different moments
        time.sleep(0.7)
        lab.kill(signal.SIGKILL)
        lab.start()
    jobs = wait_jobs(home, lambda js: all(js[i]["state"] in FINISHED for i in ids))
    assert [jobs[i]["state"] for i in ids] == ["succeeded"] * 6
    assert [jobs[i]["exit_code"] for i in ids] == [0] * 6
    started = marks.read_text().split()
    assert sorted(map(int, started)) == sorted(ids), "a job was started twice or never"


def test_lost_node_without_retries_marks_job_lost(lab, tmp_path):
    home = lab.home
    script, _ = _marker_script(tmp_path, 600)   # runs until the cancellation stops it
    job = queue_add(home, str(script), "--exclusive")
    jobs = wait_jobs(home, lambda js: js[job]["state"] == "running")
    node = jobs[job]["node"]
    lab.cluster.stop(node)
    jobs = wait_jobs(home, lambda js: js[job]["state"] == "lost")
    assert "silent" in jobs[job]["reason"]
    assert cli(home, "queue", "cancel", str(job), check=True).stdout.strip() == \
        f"job {job}: cancelled"
    assert attempt_processes(job, node, lab.home)   # still running behind the silent node
    lab.cluster.start(node)                # once it answers, the cancelled job is stopped
    wait_until(lambda: not attempt_processes(job, node, lab.home), limit=120)


def test_unknown_workload_is_profiled_alone_then_known(lab):
    home = lab.home
    script = ROOT / "jobs/steps_progress.sh"
    me = pwd.getpwuid(os.getuid()).pw_name
    label = program_label(str(script), script.read_bytes(), me)   # steps_progress.sh@me:...
    job = queue_add(home, str(script), "6000", "0.1")
    jobs = wait_jobs(home, lambda js: js[job]["workload"] == label
                 and js[job]["observed_speed"] is not None)
    assert jobs[job]["state"] == "running"
    assert jobs[job]["observed_speed"] == 1.0   # it runs alone, reporting progress
    text = cli(home, "status", check=True).stdout
    assert f"#{job} " in text and "(predicted 1.00, seen 1.00)" in text, text
    # its profile is recorded after PROFILE_SAMPLES polls alone, which may be after the first
    # progress report gave its observed speed
    shown = wait_until(lambda: (p := cli(home, "profile", "show", label, "--json")).returncode
                       == 0 and p, limit=120)
    profile = json.loads(shown.stdout)
    assert profile["source"] == f"job {job} ({me})" and profile["gpu_model"] == "NVIDIA H200"
    assert [(s["job"], s["user"], s["accepted"]) for s in profile["samples"]] == \
        [(job, me, True)]   # attributable: which job, whose, when
    assert 1 < profile["solo_it_per_s"] < 11   # 0.1 s sleeps: at most 10 steps/s
    cli(home, "queue", "cancel", str(job), check=True)
    wait_jobs(home, lambda js: js[job]["state"] == "cancelled", timeout=120)


def test_logs_follow_waits_out_a_node_that_stops_answering_for_a_while(lab, tmp_path):
    """A dropped connection or a node down for a moment is said once on stderr, and `logs
    --follow` goes on when it answers: it ends with the job, not with the hiccup."""
    home = lab.home
    gate = tmp_path / "gate"
    script = tmp_path / "gated.sh"
    script.write_text(f"#!/bin/sh\necho \"job $IADEEP_JOB_ID started\"\n"
                      f"while [ ! -e {gate} ]; do sleep 0.1; done\necho done\n")
    job = queue_add(home, str(script), "--nodelist", "node01")
    wait_jobs(home, lambda js: js[job]["state"] == "running")
    follow = subprocess.Popen([*IADEEP, "logs", str(job), "--follow"], env=env_for(home),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    node = lab.cluster.node("node01")
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(follow.stderr), daemon=True)
    try:
        assert follow.stdout.readline() == f"job {job} started\n"
        reader.start()
        node.stop()   # its sshd gone: the controller cannot read the log now
        wait_until(lambda: any(f"still following job {job}" in x for x in said), limit=120)
        node.start()
        gate.touch()
        rest = follow.stdout.read()
        assert follow.wait(timeout=240) == 0, said
    finally:
        node.start()
        gate.touch()
        follow.kill()
    assert rest == "done\n", (rest, said)


def test_logs_follow_streams_until_the_job_ends(lab, tmp_path):
    home = lab.home
    # the job ends only when the test lets it (no sleep is long enough on a loaded machine)
    gate = tmp_path / "gate"
    script = tmp_path / "gated.sh"
    script.write_text(f"#!/bin/sh\necho \"job $IADEEP_JOB_ID started\"\n"
                      f"while [ ! -e {gate} ]; do sleep 0.1; done\necho done\n")
    job = queue_add(home, str(script))
    wait_jobs(home, lambda js: js[job]["state"] == "running")
    follow = subprocess.Popen([*IADEEP, "logs", str(job), "--follow"], env=env_for(home),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = follow.stdout.readline()   # streamed while the job still runs
        gate.touch()
        rest, err = follow.communicate(timeout=240)   # returns only once the job has ended
    finally:
        gate.touch()
        follow.kill()
    assert follow.returncode == 0, err
    assert first == f"job {job} started\n" and rest.endswith("done\n")
    assert _jobs(home)[job]["state"] == "succeeded"


def test_finished_jobs_directories_go_after_the_retention(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    inv = _inventory(cluster, tmp_path)
    inv.write_text(inv.read_text().replace("lab:\n", "lab:\n  job_dir_retention: 2\n", 1))
    ctl = ControllerProcess(tmp_path / "state", inv).start()
    try:
        job = queue_add(ctl.home, str(ROOT / "jobs/hello.sh"), "x", "--env", "SLEEP_S=0")
        node = wait_jobs(ctl.home, lambda js: js[job]["state"] == "succeeded")[job]["node"]
        install = (ctl.home / "install_id").read_text().strip()   # not an earlier test's job
        jobs_dir = Path(cluster.workdir) / install / node / "jobs"
        wait_until(lambda: not list(jobs_dir.glob(f"{job}*")), limit=120)
        # the controller logs it once the removal returned: a moment after the directory went
        wait_until(lambda: "removed 1 finished jobs' directories" in ctl.log.read_text(),
                   limit=60)
    finally:
        ctl.stop()

"""The Slurm backend against a real Slurm 22.05 (slurmctld, slurmd, munged started by the tests,
fake GPUs Slurm accepts): iadeep places, Slurm runs the job as its owner on the GPU iadeep chose.

Everything a user does goes through the real CLI as a real second account (``cli_as``); what
Slurm did is read back from Slurm itself (squeue, its job-completion log), not from iadeep.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from helpers.accounts import cli_as, ensure_user
from helpers.controllers import cli, wait_until
from helpers.slurm import SHARDS, USER, add as _add, show as _show, slurm_jobs as _slurm_jobs
from iadeep_cli.nodes import slurm
from iadeep_cli.settings import Policy

pytestmark = pytest.mark.os_global
# fixtures (tests/integration/conftest.py): slurm_cluster, a real Slurm for the session;
# lab, a controller of its partition for each test


def test_queue_add_runs_on_slurm_as_its_user_on_the_gpu_iadeep_chose(lab):
    ctl, work, cluster = lab
    go = work / "go-1"
    job_id = _add(ctl, work, str(work / "job.sh"), str(go))
    job = wait_until(lambda: (j := _show(ctl, job_id))["state"] == "running" and j, limit=120)
    slurm_id = job["remote_pid"]   # the Slurm job id, recorded as the attempt's "pid"
    sj = _slurm_jobs(cluster)[slurm_id]
    assert sj["user_name"] == USER and sj["nodes"] == cluster.node
    assert sj["name"] == slurm.tag((ctl.home / "install_id").read_text().strip(), job_id, 1)
    # pinned to the GPU plan() chose: the typed GRES names it; labelled after its program (no
    # --workload given), it may share once profiled, so it holds shards of that GPU
    index = job["gpu_indices"][0]
    assert sj["gres_detail"] == [
        f"shard:g{index}:{SHARDS // Policy().max_jobs_per_gpu}(IDX:{index})"]
    # retries are iadeep's: Slurm may not run the attempt again under the same id
    assert sj["requeue"] is False
    again = subprocess.run(["scontrol", "requeue", str(slurm_id)], env=cluster.env(),
                           capture_output=True, text=True, timeout=30)
    assert again.returncode != 0, again
    assert _slurm_jobs(cluster)[slurm_id]["job_state"] == "RUNNING"
    go.touch()
    done = wait_until(lambda: (j := _show(ctl, job_id))["state"] == "succeeded" and j, limit=120)
    log = cli(ctl.home, "logs", str(job_id), check=True).stdout
    assert (f"cuda={done['gpu_indices'][0]} user={USER} job={job_id} slurm={slurm_id}"
            in log), log
    # Slurm's own record of the finished job: its user, its id
    comp = (cluster.root / "log" / "jobcomp.txt").read_text()
    line = next(x for x in comp.splitlines() if f"JobId={slurm_id} " in x)
    assert f"UserId={USER}(" in line and "JobState=COMPLETED" in line


def test_two_light_jobs_share_one_gpu_through_shards_a_heavy_one_gets_its_own(lab):
    ctl, work, cluster = lab
    go = work / "go-2"
    heavy = _add(ctl, work, "--exclusive", str(work / "job.sh"), str(go))
    light = [_add(ctl, work, "--workload", "mlp", str(work / "job.sh"), str(go)) for _ in range(2)]
    jobs = wait_until(lambda: (js := {i: _show(ctl, i) for i in (heavy, *light)}) and
                      all(j["state"] == "running" for j in js.values()) and js, limit=180)
    (h_gpu,) = jobs[heavy]["gpu_indices"]
    l_gpus = {jobs[i]["gpu_indices"][0] for i in light}
    assert len(l_gpus) == 1 and h_gpu not in l_gpus, jobs
    (l_gpu,) = l_gpus
    sq = _slurm_jobs(cluster)
    assert sq[jobs[heavy]["remote_pid"]]["gres_detail"] == [f"gpu:g{h_gpu}:1(IDX:{h_gpu})"]
    # both running at once, on shards of the same GPU: as many as the lab's default group size
    # leaves each (4 shards, up to 3 jobs a GPU: 1 shard a job)
    per_job = SHARDS // Policy().max_jobs_per_gpu
    for i in light:
        s = sq[jobs[i]["remote_pid"]]
        assert s["job_state"] == "RUNNING"
        assert s["gres_detail"] == [f"shard:g{l_gpu}:{per_job}(IDX:{l_gpu})"]
    go.touch()
    for i in (heavy, *light):
        wait_until(lambda i=i: _show(ctl, i)["state"] == "succeeded", limit=120)
        assert f"cuda={jobs[i]['gpu_indices'][0]} " in cli(ctl.home, "logs", str(i)).stdout


def test_cancel_and_list_go_through_slurm(lab):
    ctl, work, cluster = lab
    job_id = _add(ctl, work, "--name", "to-cancel", str(work / "job.sh"), str(work / "never"))
    job = wait_until(lambda: (j := _show(ctl, job_id))["state"] == "running" and j, limit=120)
    # an output file that is not the owner's is not shown (the controller reads as root)
    (work / "secret").write_text("root's\n")
    other = _add(ctl, work, "--output", str(work / "secret"), "--wrap", "sleep 30")
    wait_until(lambda: _show(ctl, other)["state"] in ("running", "failed"), limit=120)
    shown = cli(ctl.home, "logs", str(other))
    assert shown.returncode != 0 and "not iadeep-slurm-u's file" in shown.stderr, shown
    assert "root's" not in shown.stdout
    why = cli(ctl.home, "queue", "why", str(job_id), check=True).stdout
    assert f"{cluster.node}:{job['gpu_indices'][0]}" in why and str(work) in why, why
    listed = cli(ctl.home, "queue", "list", check=True).stdout
    assert "to-cancel" in listed and f"{cluster.node}:{job['gpu_indices'][0]}" in listed
    out = cli_as(USER, ctl.home, "queue", "cancel", str(job_id))
    assert out["rc"] == 0, out
    wait_until(lambda: _show(ctl, job_id)["state"] == "cancelled", limit=120)
    assert _slurm_jobs(cluster)[job["remote_pid"]]["job_state"] == "CANCELLED"


def test_a_killed_controller_neither_duplicates_nor_loses_a_slurm_job(lab):
    """SIGKILL the controller as soon as the job is placed (its sbatch may or may not have
    returned); the restarted one finds the attempt by its Slurm job name, or submits it once."""
    ctl, work, cluster = lab
    go = work / "go-4"
    job_id = _add(ctl, work, str(work / "job.sh"), str(go))
    wait_until(lambda: _show(ctl, job_id)["state"] in ("starting", "running"), limit=120,
               every=0.01)
    ctl.kill()
    ctl.start()
    job = wait_until(lambda: (j := _show(ctl, job_id))["state"] == "running" and j, limit=120)
    name = slurm.tag((ctl.home / "install_id").read_text().strip(), job_id, 1)
    named = [j for j in _slurm_jobs(cluster).values() if j["name"] == name]
    assert [j["job_id"] for j in named] == [job["remote_pid"]], named
    go.touch()
    wait_until(lambda: _show(ctl, job_id)["state"] == "succeeded", limit=120)
    assert job["attempts"] == 1


def test_launch_finds_an_attempt_slurm_already_has(lab):
    """The exactly-once rule itself: a second sbatch of the same attempt (a controller that
    died before recording the first) returns the first's Slurm id and submits nothing."""
    from iadeep_cli.inventory import parse_inventory
    from iadeep_cli.jobs import Job, JobSpec, JobState

    _ctl, work, cluster = lab
    inv = slurm.with_slurm_nodes(parse_inventory(cluster.inventory(), Path("nodes.yaml")))
    pool = slurm.SlurmPool(inv, None, "testinstall", lambda ids: {})
    job = Job(id=999, owner=USER, state=JobState.STARTING,
              spec=JobSpec(script=str(work / "job.sh"), name="dup", args=(str(work / "go-5"),),
                           workdir=str(work)),
              submitted_at=time.time(), node=cluster.node, attempts=1)
    first, before1 = slurm.launch(pool, cluster.node, job, (1,), work / "job.sh")
    second, before2 = slurm.launch(pool, cluster.node, job, (1,), work / "job.sh")
    assert (before1, before2) == (False, True) and first == second
    assert slurm.find(pool, slurm.tag("testinstall", 999, 1), USER) == [first]
    # a restarted controller's poll finds the attempt by its name (no Slurm id recorded) ...
    pool.attempts = lambda ids: {999: 1}
    (snap,) = pool.poll_slurm([pool.node(cluster.node)], {cluster.node: ((999, None, None),)})
    assert snap.job(999) is not None and snap.job(999).pid == first
    assert snap.job(999).state in ("pending", "running")   # Slurm starts it within a second
    wait_until(lambda: pool.poll_slurm([pool.node(cluster.node)], {cluster.node: (
        (999, None, None),)})[0].job(999).state == "running", limit=60)
    # ... and the next attempt's name is not the old one's
    # a Slurm job of that name that is not the owner's is not the attempt
    (snap,) = pool.poll_slurm([pool.node(cluster.node)], {cluster.node: ((999, None, None),)},
                              {999: "someone-else"})
    assert snap.job(999) is not None and snap.job(999).state == "missing"
    pool.attempts = lambda ids: {999: 2}
    (snap,) = pool.poll_slurm([pool.node(cluster.node)], {cluster.node: ((999, None, None),)})
    assert snap.job(999) is not None and snap.job(999).state == "missing"
    assert slurm.cancel(pool, 999) == "terminated"


def test_a_foreign_slurm_job_is_foreign_load(lab):
    """A job submitted to Slurm by other means holds GPU 0: iadeep sees it as foreign load
    (all of that GPU's memory) and puts its job on GPU 1."""
    ctl, work, cluster = lab
    uid = ensure_user(USER)
    foreign = cluster.run("sbatch", "--parsable", f"--uid={uid}", f"--gid={uid}",
                          "--export=NONE", "--gres=gpu:g0:1", "-o", "/dev/null",
                          "--wrap", f"while [ ! -e {work}/go-6 ]; do sleep 0.1; done").strip()
    wait_until(lambda: _slurm_jobs(cluster)[int(foreign)]["job_state"] == "RUNNING", limit=120)
    # (in status from the controller's next read of the partition)
    wait_until(lambda: f"slurm job {foreign}" in cli(ctl.home, "status", "--json",
                                                     check=True).stdout, limit=60)
    job_id = _add(ctl, work, str(work / "job.sh"), str(work / "go-6"))
    job = wait_until(lambda: (j := _show(ctl, job_id))["state"] == "running" and j, limit=120)
    assert job["gpu_indices"] == [1]
    (work / "go-6").touch()
    wait_until(lambda: _show(ctl, job_id)["state"] == "succeeded", limit=120)


def test_a_failing_job_keeps_its_exit_code(lab):
    ctl, work, _cluster = lab
    job_id = _add(ctl, work, "--wrap", "echo failing; exit 3")
    job = wait_until(lambda: (j := _show(ctl, job_id))["state"] == "failed" and j, limit=120)
    assert job["exit_code"] == 3
    assert "failing" in cli(ctl.home, "logs", str(job_id)).stdout


def test_time_limit_stops_the_slurm_job_and_says_timeout(lab):
    """iadeep's --time ends the job through scancel and records timeout (Slurm's own limit,
    the limit plus kill_grace, is only the backstop)."""
    ctl, work, cluster = lab
    job_id = _add(ctl, work, "--time", "0:03", "--wrap", "sleep 120")
    # (not waiting to see it running: on a loaded machine 3 s pass before a look)
    done = wait_until(lambda: (j := _show(ctl, job_id))["state"] == "timeout" and j, limit=120)
    assert "time limit" in done["reason"]
    assert _slurm_jobs(cluster)[done["remote_pid"]]["job_state"] == "CANCELLED"
    assert _slurm_jobs(cluster)[done["remote_pid"]]["time_limit"] == 2   # minutes: the backstop


def test_a_slurm_job_that_reports_progress_gets_an_observed_speed(lab):
    """A job on Slurm appends progress lines to $IADEEP_PROGRESS_FILE (one file per attempt, in
    its working directory); the controller reads them as it reads the job's output. Running
    alone, its observed speed is 1.0: measured, since this node has no GPU telemetry for the
    utilisation proxy."""
    ctl, work, _cluster = lab
    go = work / "go-7"
    job_id = _add(ctl, work, "--wrap",
                  f"i=0; while [ ! -e {go} ]; do i=$((i+5)); "
                  'echo "$(date +%s.%N) $i" >> "$IADEEP_PROGRESS_FILE"; sleep 0.2; done')
    job = wait_until(lambda: (j := _show(ctl, job_id))["observed_speed"] is not None and j,
                     limit=120)
    assert job["observed_speed"] == 1.0 and job["state"] == "running"
    progress = work / f"iadeep-{job_id}.1.progress"
    assert progress.owner() == USER and progress.read_text().count("\n") >= 2
    go.touch()
    wait_until(lambda: _show(ctl, job_id)["state"] == "succeeded", limit=120)


# A constructor that records the uid of every process that loads it: what a member would put
# in LD_PRELOAD to run code as whoever starts their job.
PRELOAD_C = r"""#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void record(void) {
    FILE *f = fopen("%s", "a");
    if (f) { fprintf(f, "%%d\n", (int)getuid()); fclose(f); }
}
"""


def test_a_members_ld_preload_reaches_only_their_job_never_root(lab):
    """The attack: a member's job environment with LD_PRELOAD naming their own library. The
    controller runs sbatch as root; the library must load only in the job (as the member),
    never in sbatch. Submission refuses the variable outright; the launch is driven directly
    here (a job queued before that check, or any way past it), and the job's other values,
    commas and newlines included, still reach the job whole."""
    import os
    import pwd
    import shutil

    from iadeep_cli.inventory import parse_inventory
    from iadeep_cli.jobs import Job, JobSpec, JobState

    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test's preload library")
    ctl, work, cluster = lab
    record, library, source = work / "uids", work / "record.so", work / "record.c"
    record.touch()
    os.chmod(record, 0o666)
    source.write_text(PRELOAD_C % record)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    os.chmod(library, 0o755)
    script = work / "env.sh"
    script.write_text('#!/bin/sh\nprintf "%s" "$TRICKY" > "$1.value"\n'
                      'while [ ! -e "$1" ]; do sleep 0.1; done\n')
    script.chmod(0o755)
    member = pwd.getpwnam(USER).pw_uid

    # refused at submission, with one line saying what to do instead
    refused = cli_as(USER, ctl.home, "queue", "add", "--chdir", str(work), "--env",
                     f"LD_PRELOAD={library}", str(script), str(work / "go-never"))
    assert refused["rc"] == 1 and "Traceback" not in refused["err"], refused
    assert "--env LD_PRELOAD" in refused["err"] and "inside the job script" in refused["err"]
    assert json.loads(cli(ctl.home, "queue", "list", "--json", check=True).stdout) == []

    inv = slurm.with_slurm_nodes(parse_inventory(cluster.inventory(), Path("nodes.yaml")))
    pool = slurm.SlurmPool(inv, None, "preloadtest", lambda ids: {})
    go = work / "go-preload"
    tricky = "a,b\nc 'd' $HOME;x"
    job = Job(id=998, owner=USER, state=JobState.STARTING,
              spec=JobSpec(script=str(script), name="preload", args=(str(go),),
                           workdir=str(work), env=(("LD_PRELOAD", str(library)),
                                                   ("TRICKY", tricky))),
              submitted_at=time.time(), node=cluster.node, attempts=1)
    try:
        slurm.launch(pool, cluster.node, job, (0,), script)
        value = Path(f"{go}.value")
        wait_until(lambda: value.exists() and value.read_text() == tricky, limit=120)
        uids = {int(x) for x in record.read_text().split()}
        assert uids == {member}, uids   # loaded in the job, as the member; never as root (0)
    finally:
        go.touch()
        slurm.cancel(pool, 998)


def test_root_and_a_uid_without_an_account_are_refused_at_submission(lab):
    """Slurm runs a job as its owner (``sbatch --uid``): root never, and a uid without an
    account (a deleted user's process) cannot be named. Both are refused when they submit,
    with one line saying why, never at launch; nothing is queued, in iadeep or in Slurm."""
    from helpers.accounts import cli_as_uid, unused_uid

    ctl, work, cluster = lab
    argv = ("queue", "add", "--chdir", str(work), str(work / "job.sh"), str(work / "never"))
    root = cli(ctl.home, *argv)   # the tests run as root
    assert root.returncode == 1 and "Traceback" not in root.stderr, root.stderr
    first = root.stderr.splitlines()[0]
    assert (f"root may not run jobs on any node this job could use: iadeep never runs a job as "
            f"root (Slurm node {cluster.node})") in first, root.stderr
    uid = unused_uid()
    ghost = cli_as_uid(uid, ctl.home, *argv)
    assert ghost["rc"] == 1 and "Traceback" not in ghost["err"], ghost
    assert f"uid{uid} has no account on the controller's machine" in \
        ghost["err"].splitlines()[0], ghost
    assert json.loads(cli(ctl.home, "queue", "list", "--all", "--json", check=True).stdout) == []
    assert cluster.run("squeue", "-h") == ""


def test_host_memory_reaches_slurm_which_enforces_it(lab):
    """On a Slurm node --mem (host RAM, as Slurm's) goes to sbatch: Slurm's own limit, read back
    from Slurm."""
    ctl, work, cluster = lab
    job_id = _add(ctl, work, "--mem", "64M", "--cpus-per-task", "1", "--wrap", "sleep 60")
    job = wait_until(lambda: (j := _show(ctl, job_id))["remote_pid"] and j, limit=120)
    record = _slurm_jobs(cluster)[job["remote_pid"]]
    memory = record["memory_per_node"]
    assert (memory["number"] if isinstance(memory, dict) else memory) == 64, record
    cli(ctl.home, "queue", "cancel", str(job_id))

"""Submitting like sbatch, end to end: real sshd nodes, a real controller, the real CLI run from
a submission directory, and the jobs' files read back from disk.

The nodes are sshd servers on this machine, so the test's directory is really shared with
them; node01 declares it (shared_paths), node02 does not, which is how both defaults of the
working directory are proven. node01 is labelled fast, node02 slow.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers.controllers import (
    IADEEP,
    cli,
    env_for,
    fake_gpu_lab,
    jobs_by_id,
    wait_finished,
    wait_jobs,
)

LABELS = {"node01": "[fast, nvlink]", "node02": "[slow]"}


def _labelled(shared: Path, text: str) -> str:
    """The nodes' YAML with each node's labels and shared paths (``shared`` on node01 only)
    after its workdir: line."""
    for name, labels in LABELS.items():
        paths = f"[{shared}]" if name == "node01" else "[]"
        head, sep, rest = text.partition(f"- name: {name}\n")
        line_end = rest.index("\n", rest.index("workdir:")) + 1
        text = (head + sep + rest[:line_end] + f"    labels: {labels}\n"
                f"    shared_paths: {paths}\n" + rest[line_end:])
    return text


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    submit = tmp_path / "project"
    submit.mkdir()
    with fake_gpu_lab(sshd_cluster, tmp_path, nodes=2, lab="node_grace: 5",
                      edit_nodes=lambda text: _labelled(tmp_path, text)) as ctl:
        ctl.submit = submit
        yield ctl


def submit(lab, *args: str, cwd: Path | None = None, check: bool = True,
           **env: str) -> subprocess.CompletedProcess:
    """`iadeep queue add ARGS` run from ``cwd`` (default: the lab's submission directory)."""
    proc = subprocess.run([*IADEEP, "queue", "add", *args], cwd=cwd or lab.submit,
                          env=env_for(lab.home, **env), capture_output=True, text=True,
                          timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def add(lab, *args: str, **env: str) -> int:
    return int(submit(lab, *args, **env).stdout)


def test_directives_wrap_chdir_and_working_directory_defaults(lab):
    script = lab.submit / "train.sh"
    script.write_text("#!/bin/sh\n"
                      "# set up like an sbatch script\n"
                      "#IADEEP --name from-directive --output out-%j-%x.txt\n"
                      "#IADEEP --env A=directive --env B=directive --nodelist node01\n"
                      "echo \"A=$A B=$B pwd=$(pwd)\"\n")
    script.chmod(0o755)
    directed = add(lab, "train.sh", "--env", "B=cli", "--name", "cli-name")
    wrapped = add(lab, "--wrap", "echo wrapped; pwd", "--nodelist", "node01")
    (lab.submit / "sub").mkdir()
    chdir = add(lab, "--chdir", "sub", "--wrap", "pwd > where.txt")
    unshared = add(lab, "--wrap", "pwd", "--nodelist", "node02")
    jobs = wait_finished(lab.home, [directed, wrapped, chdir, unshared])
    assert all(jobs[i]["state"] == "succeeded" for i in (directed, wrapped, chdir, unshared))

    # The command line won (--name; B), the directives filled in the rest; --output is
    # relative to the shared submission directory, where the job ran.
    assert jobs[directed]["name"] == "cli-name" and jobs[directed]["node"] == "node01"
    out = lab.submit / f"out-{directed}-cli-name.txt"
    assert out.read_text() == f"A=directive B=cli pwd={lab.submit}\n"
    assert cli(lab.home, "logs", str(directed), check=True).stdout == out.read_text()

    assert jobs[wrapped]["name"] == "wrap"
    assert cli(lab.home, "logs", str(wrapped), check=True).stdout == \
        f"wrapped\n{lab.submit}\n"
    assert (lab.submit / "sub" / "where.txt").read_text() == f"{lab.submit / 'sub'}\n"

    # node02 does not share the directory: the job ran in its own job directory, and says so.
    ran_in = cli(lab.home, "logs", str(unshared), check=True).stdout.strip()
    assert ran_in.endswith(f"/node02/jobs/{unshared}") and ran_in != str(lab.submit)
    why = json.loads(cli(lab.home, "queue", "show", str(unshared), "--json",
                         check=True).stdout)["events"]
    assert any(f"{lab.submit} is not in node02's shared_paths" in e["reason"] for e in why)
    shown = cli(lab.home, "queue", "show", str(directed), check=True).stdout   # its events
    assert f"in {lab.submit} (the submission directory, shared on node01)" in shown


def test_a_directive_it_does_not_know_is_refused_naming_the_line(lab):
    script = lab.submit / "bad.sh"
    script.write_text("#!/bin/sh\n#IADEEP --gpus 1\n#IADEEP --frobnicate gpu\necho no\n")
    proc = submit(lab, "bad.sh", check=False)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1
    assert f"{script}:3: #IADEEP --frobnicate gpu: No such option: --frobnicate" in proc.stderr
    assert jobs_by_id(lab.home) == {}


def test_export_default_names_and_none(lab):
    show = "echo \"V=${VIRTUAL_ENV-unset} X=${EXTRA_X-unset} E=${E-unset}\""
    env = {"VIRTUAL_ENV": "/opt/venvs/x", "EXTRA_X": "x 'quoted' $(id)"}
    default = add(lab, "--wrap", show, "--env", "E=1", **env)
    named = add(lab, "--wrap", show, "--export", "EXTRA_X", **env)
    none = add(lab, "--wrap", show, "--export", "NONE", **env)
    jobs = wait_finished(lab.home, [default, named, none])
    logs = {i: cli(lab.home, "logs", str(i), check=True).stdout for i in (default, named, none)}
    assert logs[default] == "V=/opt/venvs/x X=unset E=1\n"
    assert logs[named] == "V=unset X=x 'quoted' $(id) E=unset\n"
    assert logs[none] == "V=unset X=unset E=unset\n"
    assert jobs[named]["exported"] == {"EXTRA_X": "x 'quoted' $(id)"}
    assert "PATH" in jobs[default]["exported"] and jobs[default]["env"] == {"E": "1"}


def test_output_and_error_are_separate_streams_read_by_logs(lab):
    (lab.submit / "logs").mkdir()
    both = add(lab, "--wrap", "echo to-out; echo to-err >&2", "--output", "logs/o-%j.txt",
               "--error", "logs/e-%j.txt", "--nodelist", "node01")
    merged = add(lab, "--wrap", "echo to-out; echo to-err >&2", "--output", "m-%j.txt",
                 "--nodelist", "node01")
    jobs = wait_finished(lab.home, [both, merged])
    assert jobs[both]["state"] == jobs[merged]["state"] == "succeeded"
    assert (lab.submit / "logs" / f"o-{both}.txt").read_text() == "to-out\n"
    assert (lab.submit / "logs" / f"e-{both}.txt").read_text() == "to-err\n"
    assert cli(lab.home, "logs", str(both), check=True).stdout == "to-out\n"
    assert cli(lab.home, "logs", str(both), "--stderr", check=True).stdout == "to-err\n"
    assert (lab.submit / f"m-{merged}.txt").read_text() == "to-out\nto-err\n"
    refused = cli(lab.home, "logs", str(merged), "--stderr")
    assert refused.returncode != 0 and "has no separate stderr" in refused.stderr


def test_constraint_and_nodelist_choose_nodes_and_impossible_ones_are_refused(lab):
    fast = [add(lab, "--wrap", "true", "--constraint", "fast&nvlink") for _ in range(3)]
    slow = [add(lab, "--wrap", "true", "-C", "slow") for _ in range(2)]
    listed = add(lab, "--wrap", "true", "--nodelist", "node02,node01", "--exclude", "node01")
    jobs = wait_finished(lab.home, [*fast, *slow, listed])
    assert {jobs[i]["node"] for i in fast} == {"node01"}
    assert {jobs[i]["node"] for i in (*slow, listed)} == {"node02"}
    assert jobs[fast[0]]["constraint"] == ["fast", "nvlink"]
    for args, says in ((["-C", "fast&slowish"], "no node has the label slowish"),
                       (["--nodelist", "node09"], "--nodelist: no node named node09"),
                       (["-C", "fast", "--exclude", "node01"],
                        "no node meets all of --constraint fast --exclude node01")):
        proc = submit(lab, "--wrap", "true", *args, check=False)
        assert proc.returncode != 0 and says in proc.stderr, proc.stderr
    assert len(jobs_by_id(lab.home)) == 6   # nothing refused was queued


def test_queue_why_says_a_job_waits_for_its_nodes(lab):
    # held alone (--exclusive): a new program may otherwise start beside it (cold start: share)
    held = add(lab, "--wrap", "sleep 30", "--nodelist", "node02", "--exclusive")
    waiting = add(lab, "--wrap", "true", "--nodelist", "node02")

    wait_jobs(lab.home, lambda js: js[waiting]["state"] == "queued"
              and "it may run only on node02" in js[waiting]["reason"])
    assert "--nodelist node02" in cli(lab.home, "queue", "why", str(waiting)).stdout
    cli(lab.home, "queue", "cancel", str(held), check=True)
    jobs = wait_finished(lab.home, [waiting])
    assert jobs[waiting]["node"] == "node02"

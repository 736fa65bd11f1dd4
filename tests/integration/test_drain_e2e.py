"""`iadeep nodes drain/resume`: a drained node takes no new jobs while its running ones finish
(Slurm's drain state), says so in `status` and in the waiting jobs' reasons, survives a
controller restart, and only admins may drain. Real sshd nodes, a real controller."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.accounts import BOB, cli_as, needs_root, shared_dir
from helpers.controllers import cli, fake_gpu_lab, jobs_by_id, queue_add, wait_jobs, wait_until

ROOT = Path(__file__).resolve().parents[2]
LONG = str(ROOT / "jobs/steps_progress.sh")


def _state(home, job: int) -> str:
    return jobs_by_id(home)[job]["state"]


def test_a_drained_node_takes_no_new_jobs_while_its_running_ones_finish(sshd_cluster,
                                                                        tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, gpus=2) as lab:
        home = lab.home
        first = queue_add(home, LONG, "600", "0.1", "--exclusive")
        wait_jobs(home, lambda js: js[first]["state"] == "running")

        said = cli(home, "nodes", "drain", "node01", "--reason", "driver update", check=True)
        assert said.stdout.strip() == ("node node01 drained: no new jobs start there; running "
                                       f"there until they finish: {first}")
        second = queue_add(home, LONG, "5", "0.1", "--exclusive")   # GPU 1 is free, but...
        reason = wait_jobs(home, lambda js: "drained" in js[second]["reason"])[second]["reason"]
        assert "node node01 is drained by " in reason and "driver update" in reason, reason
        assert _state(home, second) == "queued" and _state(home, first) == "running"
        status = cli(home, "status", check=True).stdout
        assert "DRAINED by" in status and ": driver update" in status, status
        node = json.loads(cli(home, "status", "--json", check=True).stdout)["nodes"][0]
        assert node["drain"]["reason"] == "driver update"

        lab.stop()                       # the drain is recorded: a restart keeps it
        lab.start()
        wait_until(lambda: json.loads(cli(home, "status", "--json", check=True).stdout)
                   ["live"], limit=60)
        assert _state(home, second) == "queued"

        said = cli(home, "nodes", "resume", "node01", check=True)
        assert said.stdout.strip() == "node node01 resumed: new jobs may start there"
        wait_jobs(home, lambda js: js[second]["state"] in ("running", "succeeded"))
        assert _state(home, first) == "running"   # never touched by the drain
        again = cli(home, "nodes", "resume", "node01", check=True)
        assert again.stdout.strip() == "node node01 was not drained; nothing changed"


def test_drain_refuses_bad_input_in_one_line(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path) as lab:
        for argv, says in ((["nodes", "drain", "nope", "--reason", "x"],
                            "no node named 'nope' in the controller's inventory"),
                           (["nodes", "drain", "node01", "--reason", "   "],
                            "a drain needs a reason")):
            done = cli(lab.home, *argv)
            assert done.returncode == 1 and done.stderr.count("\n") == 1, done
            assert says in done.stderr, done
        done = cli(lab.home, "nodes", "drain", "node01")
        assert done.returncode == 2 and "--reason" in done.stderr, done


@pytest.mark.os_global
@needs_root
def test_only_an_admin_may_drain_or_resume_a_node(sshd_cluster):
    with shared_dir("iadeep-drain-") as top, fake_gpu_lab(sshd_cluster, top) as lab:
        for argv in (["nodes", "drain", "node01", "--reason", "mine now"],
                     ["nodes", "resume", "node01"]):
            done = cli_as(BOB, lab.home, *argv)
            assert done["rc"] == 1, done
            assert f"only a lab admin may drain or resume a node; {BOB} is not one" in \
                done["err"], done
        status = json.loads(cli(lab.home, "status", "--json", check=True).stdout)
        assert all(n["drain"] is None for n in status["nodes"])

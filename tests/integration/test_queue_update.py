"""`iadeep queue update`: a job changed after submission as `scontrol update` does it, with the
checks and caps of `queue add`, recorded in its events; members change only their own jobs,
and only an admin extends a running job. A real controller (and real sshd nodes, accounts)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.accounts import ALICE, BOB, cli_as, needs_root, sh_script, shared_dir, submitted
from helpers.controllers import cli, fake_gpu_lab, jobs_by_id, queue_add, wait_jobs

ROOT = Path(__file__).resolve().parents[2]


def _show(home, job: int) -> dict:
    return json.loads(cli(home, "queue", "show", str(job), "--json", check=True).stdout)


def _spec(home, job: int) -> dict:
    """What was asked of the job (not its reason or priority's aging, which move on)."""
    return {k: v for k, v in _show(home, job).items()
            if k not in ("reason", "effective_priority", "events")}


def test_a_waiting_job_takes_a_new_name_time_priority_and_dependencies(controller, script):
    home = controller.home
    first = queue_add(home, str(script), "--name", "prep")
    job = queue_add(home, str(script), "--name", "train", "--time", "1:00:00")
    said = cli(home, "queue", "update", str(job), "--name", "train-lr3", "--time", "2-0",
               "--priority", "3", "--after", str(first), check=True).stdout
    assert said.strip() == (f"job {job}: name train -> train-lr3; time 1:00:00 -> "
                            f"2-00:00:00; priority 0 -> 3; after none -> {first}")
    shown = _show(home, job)
    assert (shown["name"], shown["time_limit_s"], shown["priority"], shown["after"]) == \
        ("train-lr3", 2 * 86400, 3, [first])
    assert shown["events"][-1]["reason"].startswith("updated by ")
    again = cli(home, "queue", "update", str(job), "--priority", "3", check=True).stdout
    assert again.strip() == f"job {job}: nothing changed (already so)"


@pytest.mark.parametrize("argv, says", [
    ([], "nothing to change"),
    (["--time", "soon"], "--time"),
    (["--after", "{newer}"], "may depend only on jobs submitted before it"),
    (["--after", "999999"], "there is no job 999999"),
])
def test_bad_updates_are_one_line_errors_and_change_nothing(controller, script, argv, says):
    home = controller.home
    job = queue_add(home, str(script), "--name", "keep")
    newer = queue_add(home, str(script))
    before = _spec(home, job)
    done = cli(home, "queue", "update", str(job), *[a.format(newer=newer) for a in argv])
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done
    assert says in done.stderr and "Traceback" not in done.stderr, done
    assert _spec(home, job) == before


@pytest.mark.os_global
@needs_root
def test_members_update_only_their_own_jobs_within_the_caps_and_admins_extend_running_ones(
        sshd_cluster):
    with shared_dir("iadeep-update-") as top, fake_gpu_lab(sshd_cluster, top) as lab:
        home = lab.home
        long = sh_script(top, "long.sh", "sleep 600")
        # exclusive: the same program may share a GPU with itself once profiled; this one waits
        hers = submitted(cli_as(ALICE, home, "queue", "add", long, "--time", "1:00:00",
                                "--exclusive"))
        wait_jobs(home, lambda js: js[hers]["state"] == "running")
        waiting = submitted(cli_as(ALICE, home, "queue", "add", long, "--name", "w",
                                   "--exclusive"))

        other = cli_as(BOB, home, "queue", "update", str(waiting), "--name", "mine")
        assert other["rc"] == 1 and f"{BOB} may not change it" in other["err"], other
        capped = cli_as(ALICE, home, "queue", "update", str(waiting), "--priority", "11")
        assert capped["rc"] == 1 and "members may set at most 10" in capped["err"], capped
        longer = cli_as(ALICE, home, "queue", "update", str(hers), "--time", "2:00:00")
        assert longer["rc"] == 1 and "only a lab admin may raise its time limit" in \
            longer["err"], longer
        only_time = cli_as(ALICE, home, "queue", "update", str(hers), "--name", "x")
        assert only_time["rc"] == 1 and "only its time limit can change now" in \
            only_time["err"], only_time
        shorter = cli_as(ALICE, home, "queue", "update", str(hers), "--time", "30")
        assert shorter["rc"] == 0 and "time 1:00:00 -> 0:30:00" in shorter["out"], shorter
        raised = cli(home, "queue", "update", str(hers), "--time", "3:00:00", check=True)
        assert "time 0:30:00 -> 3:00:00" in raised.stdout          # root: an admin
        assert jobs_by_id(home)[hers]["time_limit_s"] == 3 * 3600
        cli(home, "queue", "cancel", str(hers), str(waiting), check=True)

"""`iadeep report` end to end: a real controller runs real jobs on its own machine (a local
node, the fake NVML library), and the real `iadeep report --json` must match the figures
computed by hand from the recorded events (`queue show --json`), while the controller runs and
after it stopped. Other accounts get one line saying the database is private."""
from __future__ import annotations

import importlib
import itertools
import json
import os
import pwd
from pathlib import Path

import pytest

from helpers.accounts import cli_as, shared_dir
from helpers.controllers import ControllerProcess, cli, queue_add, wait_finished
from helpers.local_node import local_lab


def _by_hand(home: Path, ids: list[int]) -> dict[str, dict]:
    """Per user: jobs, GPU-hours and queue waits, from each job's events (docs/accounting.md's
    definitions: GPUs x time in starting/running over all attempts; submit -> first start)."""
    users: dict[str, dict] = {}
    for job_id in ids:
        job = json.loads(cli(home, "queue", "show", str(job_id), "--json", check=True).stdout)
        events = job["events"]
        held = sum(nxt["at"] - ev["at"] for ev, nxt in itertools.pairwise(events)
                   if ev["new_state"] in ("starting", "running"))
        starts = [ev["at"] for ev in events if ev["new_state"] == "starting"]
        u = users.setdefault(job["user"], {"jobs": 0, "gpu_hours": 0.0, "waits": []})
        u["jobs"] += 1
        u["gpu_hours"] += job["gpus"] * held / 3600
        if starts:
            u["waits"].append(starts[0] - job["submitted_at"])
    return users


def _report(home: Path) -> dict:
    proc = cli(home, "report", "--since", "1d", "--by", "user", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def state(monkeypatch):
    # Not under pytest's tmp_path: another account must reach the database to be refused
    with shared_dir("iadeep-report-") as top:
        yield top


def test_report_matches_the_events_live_and_after_stop(monkeypatch, state):
    inventory = local_lab(monkeypatch, state / "nodes.yaml", state / "wd")
    ok_sh, fail_sh = state / "ok.sh", state / "fail.sh"
    ok_sh.write_text("#!/bin/sh\nsleep 1\n")
    fail_sh.write_text("#!/bin/sh\nsleep 0.5\nexit 3\n")
    ctl = ControllerProcess(state / "home", inventory).start()
    home = ctl.home
    try:
        two = queue_add(home, str(ok_sh), "--gpus", "2")
        failing = queue_add(home, str(fail_sh))
        # never runnable once `failing` failed: cancelled without ever starting
        after = queue_add(home, str(ok_sh), "--after", str(failing))
        ids = [two, failing, after]
        jobs = wait_finished(home, ids)
        assert [jobs[i]["state"] for i in ids] == ["succeeded", "failed", "cancelled"]
        live = _report(home)
        want = _by_hand(home, ids)
        [group] = live["groups"]
        user = group["key"]
        assert group["jobs"] == live["total"]["jobs"] == 3
        assert group["states"] == {"succeeded": 1, "failed": 1, "cancelled": 1, "timeout": 0}
        assert group["gpu_hours"] == pytest.approx(want[user]["gpu_hours"], rel=0.01, abs=1e-4)
        assert group["gpu_hours"] > 2 * 1.0 / 3600   # the 2-GPU job ran at least its 1 s sleep
        waits = sorted(want[user]["waits"])
        assert len(waits) == 2                        # the cancelled job never started
        assert group["wait_p50_s"] == pytest.approx((waits[0] + waits[1]) / 2, abs=1e-3)
        assert group["wait_p95_s"] == pytest.approx(waits[0] + 0.95 * (waits[1] - waits[0]),
                                                    abs=1e-3)
        # CSV: the same figures, one header line, one line per user and the total
        csv_lines = cli(home, "report", "--since", "1d", "--by", "user", "--csv",
                        check=True).stdout.splitlines()
        assert csv_lines[0].startswith("user,jobs,succeeded,failed,cancelled,timeout,")
        assert [line.split(",")[0] for line in csv_lines[1:]] == [user, "total"]
    finally:
        assert ctl.stop() == 0
    stopped = _report(home)
    assert stopped["groups"] == live["groups"] and stopped["total"] == live["total"]


def test_bad_options_are_one_line_errors(state):
    home = state / "home"
    for argv, says in ((["--since", "yesterday"], "--since 'yesterday' is not a time"),
                       (["--until", "2026-02-30"], "--until '2026-02-30' is not a time"),
                       (["--since", "1d", "--until", "2d"], "is not before --until"),
                       (["--by", "month"], "--by 'month' is not one of user, workload"),
                       ([], "no database at")):
        proc = cli(home, "report", *argv)
        assert proc.returncode == 1 and proc.stdout == "", (argv, proc.stderr)
        assert proc.stderr.count("\n") == 1 and says in proc.stderr, (argv, proc.stderr)


@pytest.mark.skipif(os.geteuid() != 0, reason="second OS accounts need root")
def test_admins_get_the_lab_report_and_members_their_own_through_the_controller(
        monkeypatch, state):
    """Only the controller's account may read its database; the others ask the controller:
    an admin gets the whole lab's accounting, a member only their own jobs' (said on stderr,
    and another user's refused). With the controller down too: one line saying both."""
    for name in ("iadeep_cli.controller.client", "iadeep_cli.store.report"):
        importlib.import_module(name)   # loaded before the forks (see cli_as)

    admin, member = "iadeep-rp-admin", "iadeep-bob"
    inventory = local_lab(monkeypatch, state / "nodes.yaml", state / "wd")
    inventory.write_text(inventory.read_text().replace("lab:\n", f"lab:\n  admins: [{admin}]\n"))
    ok_sh = state / "ok.sh"
    ok_sh.write_text("#!/bin/sh\nexit 0\n")
    ctl = ControllerProcess(state / "home", inventory).start()
    try:
        os.chmod(ctl.home, 0o755)
        job = queue_add(ctl.home, str(ok_sh))
        owner = wait_finished(ctl.home, [job])[job]["user"]
        lab = cli_as(admin, ctl.home, "report", "--since", "1d", "--by", "user", "--json")
        assert lab["rc"] == 0 and lab["err"] == "", lab
        rep = json.loads(lab["out"])
        assert [g["key"] for g in rep["groups"]] == [owner] and rep["total"]["jobs"] == 1
        assert rep == _report(ctl.home) | {"now": rep["now"], "until": rep["until"],
                                           "since": rep["since"]}
        own = cli_as(member, ctl.home, "report", "--since", "1d", "--json")
        assert own["rc"] == 0 and json.loads(own["out"])["total"]["jobs"] == 0, own
        assert f"only {member}'s own jobs" in own["err"], own
        other = cli_as(member, ctl.home, "report", "--user", owner)
        assert other["rc"] == 1 and f"{member} may see only their own jobs' accounting" in \
            other["err"], other
        # `tune` replays the database itself (no controller request answers it): an admin who
        # may not read it is told to run it as the controller's account, not to start the
        # controller that is running
        tune = cli_as(admin, ctl.home, "tune")
        assert tune["rc"] == 1 and tune["err"].count("\n") == 1, tune
        assert "`iadeep tune` reads the controller's database" in tune["err"], tune
        owner_account = pwd.getpwuid(os.stat(ctl.home).st_uid).pw_name
        assert f"run it as that account: sudo -u {owner_account} sh -lc 'iadeep tune'" in \
            tune["err"] and "start the controller" not in tune["err"], tune
    finally:
        ctl.stop()
    out = cli_as(member, ctl.home, "report")
    assert out["rc"] == 1 and out["out"] == "" and out["err"].count("\n") == 1, out
    assert "only the controller's account and root may read" in out["err"], out
    assert "the controller, which reports to admins and members, is not running" in out["err"]

"""The queue through a real controller process and the real `iadeep` command."""
import json
import signal
import subprocess
import sys
import textwrap

from helpers.controllers import ControllerProcess, cli, controller_on, jobs_by_id, wait_until


def test_add_list_show_hold_release_cancel(controller, script):
    home = controller.home
    job_id = cli(home, "queue", "add", str(script), "a b", "--gpus", "2", "--name", "demo",
                 "--env", "LR=0.1", "--priority", "5", "--", "--epochs", "3", check=True
                 ).stdout.strip()
    assert job_id == "1"
    rows = json.loads(cli(home, "queue", "list", "--json", check=True).stdout)
    assert [(r["id"], r["name"], r["state"], r["gpus"]) for r in rows] == [(1, "demo", "queued", 2)]
    assert {"id", "name", "user", "state", "gpus", "node", "submitted_at"} <= set(rows[0])
    shown = json.loads(cli(home, "queue", "show", "1", "--json", check=True).stdout)
    assert shown["args"] == ["a b", "--epochs", "3"] and shown["env"] == {"LR": "0.1"}
    assert shown["script"] == str(script) and shown["priority"] == 5
    assert cli(home, "queue", "hold", "1", check=True).stdout.strip() == "job 1: held"
    assert cli(home, "queue", "release", "1", check=True).stdout.strip() == "job 1: queued"
    assert (cli(home, "queue", "priority", "1", "9", check=True).stdout.strip()
            == "job 1: priority 9")
    assert cli(home, "queue", "cancel", "1", check=True).stdout.strip() == "job 1: cancelled"
    assert json.loads(cli(home, "queue", "list", "--json").stdout) == []
    everything = json.loads(cli(home, "queue", "list", "--all", "--json").stdout)
    assert [r["state"] for r in everything] == ["cancelled"]
    events = json.loads(cli(home, "queue", "show", "1", "--json").stdout)["events"]
    assert [e["new_state"] for e in events] == ["queued", "held", "queued", "queued", "cancelled"]
    text = cli(home, "queue", "show", "1").stdout
    assert "cancelled by" in text and "priority 5 -> 9" in text


def test_a_time_limit_travels_from_queue_add_to_queue_show(controller, script):
    home = controller.home
    job_id = cli(home, "queue", "add", str(script), "--time", "1-2:30", check=True).stdout.strip()
    shown = json.loads(cli(home, "queue", "show", job_id, "--json", check=True).stdout)
    assert shown["time_limit_s"] == 86400 + 2 * 3600 + 30 * 60
    text = cli(home, "queue", "show", job_id, check=True).stdout
    assert "time_limit_s: 1-02:30:00" in text
    other = cli(home, "queue", "add", str(script), check=True).stdout.strip()
    assert json.loads(cli(home, "queue", "show", other, "--json").stdout)["time_limit_s"] is None


def _one_line_error(proc, *fragments):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_bad_input_is_one_line_error(controller, script, tmp_path):
    home = controller.home
    _one_line_error(cli(home, "queue", "cancel", "42"), "no job with id 42")
    _one_line_error(cli(home, "queue", "show", "42"), "no job with id 42")
    _one_line_error(cli(home, "queue", "add", str(script), "--gpus", "-1"), "--gpus", "-1")
    _one_line_error(cli(home, "queue", "add", str(script), "--gpus", "0"), "--gpus")
    _one_line_error(cli(home, "queue", "add", str(tmp_path / "nope.sh")), "nope.sh", "not found")
    _one_line_error(cli(home, "queue", "add", str(script), "--env", "NOEQUALS"), "--env",
                    "NAME=VALUE")
    _one_line_error(cli(home, "queue", "add", str(script), "--env", "1BAD=x"), "--env")
    _one_line_error(cli(home, "queue", "add", str(script), "--mem", "-3"), "--mem")
    _one_line_error(cli(home, "queue", "add", str(script), "--time", "2hours"), "--time '2hours'",
                    "2:00:00")
    _one_line_error(cli(home, "queue", "add", str(script), "--time", "0"), "--time")
    _one_line_error(cli(home, "queue", "add", str(script), "--signal", "USR1@60"),
                    "--signal USR1@60 is sent before the time limit, and this job has none")
    no_shebang = tmp_path / "train.py"
    no_shebang.write_text("import torch\n")
    _one_line_error(cli(home, "queue", "add", str(no_shebang)), "train.py",
                    "#!/usr/bin/env python3")
    (tmp_path / "bad.yaml").write_text("nodes:\n  - name: a\n    hots: x\n")
    _one_line_error(cli(home, "controller", "run", "--inventory", str(tmp_path / "bad.yaml")),
                    "bad.yaml:3", "hots")
    _one_line_error(cli(home, "controller", "run", "--inventory", str(tmp_path)),
                    "cannot read inventory")
    _one_line_error(cli(home, "controller", "run", "--inventory", str(tmp_path / "none.yaml")),
                    "not found")
    assert json.loads(cli(home, "queue", "list", "--json").stdout) == []


def test_second_controller_is_refused(controller):
    _one_line_error(cli(controller.home, "controller", "run"), "already running")


def test_without_controller_writes_fail_and_reads_show_age(tmp_path, script):
    home = tmp_path / "state"
    _one_line_error(cli(home, "queue", "add", str(script)), "controller is not running")
    _one_line_error(cli(home, "queue", "cancel", "1"), "controller is not running")
    ctl = ControllerProcess(home).start()
    cli(home, "queue", "add", str(script), check=True)
    ctl.stop()
    listed = cli(home, "queue", "list")
    assert listed.returncode == 0 and "controller is not running" in listed.stderr
    assert "last heartbeat" in listed.stderr and " queued " in listed.stdout
    status = cli(home, "status")
    assert status.returncode == 0 and "NOT running" in status.stdout


SUBMITTER = textwrap.dedent("""
    import json, sys
    from iadeep_cli.controller import client
    from iadeep_cli.jobs import SubmitSpec
    ids = []
    for i in range(int(sys.argv[2])):
        spec = SubmitSpec.from_dict({"script": sys.argv[1], "name": f"w{sys.argv[3]}-{i}"})
        try:
            ids.append(client.submit(spec, b"#!/bin/sh\\ntrue\\n").id)
        except Exception as exc:  # the controller may be down for a moment in the crash test
            print(f"refused: {exc}", file=sys.stderr)
    print(json.dumps(ids))
""")


def _submitters(home, script, n_procs, n_jobs):
    from helpers.controllers import env_for
    return [subprocess.Popen([sys.executable, "-c", SUBMITTER, str(script), str(n_jobs), str(p)],
                             env=env_for(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for p in range(n_procs)]


def _accepted(procs):
    ids = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        ids += json.loads(out)
    return ids


def test_1000_concurrent_submissions_then_sigkill_keeps_every_job(controller, script):
    procs = _submitters(controller.home, script, 20, 50)
    ids = _accepted(procs)
    assert len(ids) == 1000 and len(set(ids)) == 1000
    controller.kill(signal.SIGKILL)
    controller.start()
    rows = json.loads(cli(controller.home, "queue", "list", "--json", check=True).stdout)
    assert sorted(r["id"] for r in rows) == sorted(ids)
    assert len({r["name"] for r in rows}) == 1000  # every (process, index) exactly once


def test_controller_killed_during_submissions_loses_and_duplicates_nothing(controller, script):
    procs = _submitters(controller.home, script, 4, 60)
    # killed among the submissions: once some were accepted, not after a fixed second, which
    # on a loaded machine can end before the submitters' first (the test then kills an idle
    # controller and proves nothing)
    wait_until(lambda: jobs_by_id(controller.home), limit=120)
    controller.kill(signal.SIGKILL)
    controller.start()
    ids = _accepted(procs)
    rows = json.loads(cli(controller.home, "queue", "list", "--json", check=True).stdout)
    stored = [r["id"] for r in rows]
    assert set(ids) <= set(stored), "a job the client saw accepted is missing"
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)), "a submission was stored twice"


def test_the_labs_default_retries_apply_unless_the_job_says(tmp_path, script):
    ctl = controller_on(tmp_path, lab="default_retries: 2")
    try:
        default = cli(ctl.home, "queue", "add", str(script), check=True).stdout.strip()
        explicit = cli(ctl.home, "queue", "add", str(script), "--retries", "0",
                       check=True).stdout.strip()
        shown = {i: json.loads(cli(ctl.home, "queue", "show", i, "--json").stdout)["retries"]
                 for i in (default, explicit)}
        assert shown == {default: 2, explicit: 0}
    finally:
        ctl.stop()


def test_the_labs_time_limits_apply_and_cap_the_jobs_own(tmp_path, script):
    ctl = controller_on(tmp_path, lab="default_time_limit: 1h\nmax_time_limit: 2d")
    try:
        default = cli(ctl.home, "queue", "add", str(script), check=True).stdout.strip()
        own = cli(ctl.home, "queue", "add", str(script), "--time", "1-0", check=True
                  ).stdout.strip()
        shown = {i: json.loads(cli(ctl.home, "queue", "show", i, "--json").stdout)
                 ["time_limit_s"] for i in (default, own)}
        assert shown == {default: 3600, own: 86400}
        _one_line_error(cli(ctl.home, "queue", "add", str(script), "--time", "3-0"),
                        "--time 3-00:00:00 is longer than this lab allows (2-00:00:00)")
        listed = cli(ctl.home, "queue", "list", check=True).stdout.splitlines()
        assert listed[0].split() == ["ID", "NAME", "USER", "STATE", "GPUS", "WHERE", "AGE",
                                     "TIME", "REASON"]
        assert [line.split()[7] for line in listed[1:]] == ["-/1h00m", "-/1d0h"]
    finally:
        ctl.stop()


def test_shell_completion_offers_job_ids_and_workloads(controller, script):
    """What `iadeep --install-completion` wires up: Tab after `queue show` offers the
    unfinished jobs' ids, after `profile show` the known workloads (bash's protocol)."""
    home = controller.home
    ids = [cli(home, "queue", "add", str(script), check=True).stdout.strip() for _ in range(2)]

    def offered(words: str) -> list[str]:
        proc = cli(home, _IADEEP_COMPLETE="complete_bash", COMP_WORDS=words,
                   COMP_CWORD=str(len(words.split(" ")) - 1))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert offered("iadeep queue show ") == ids
    assert offered(f"iadeep queue cancel {ids[1]}") == [ids[1]]
    assert offered("iadeep profile show res") == ["resnet18", "resnet50"]


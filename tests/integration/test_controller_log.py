"""The controller's log, read from a real controller process driving a real sshd node: every
job transition and the start and stop are there, and libraries' INFO chatter is not."""
import re
from pathlib import Path

from helpers.controllers import (
    ControllerProcess,
    cli,
    jobs_by_id,
    kill_attempt,
    queue_add,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]


def test_log_tells_the_labs_story_without_library_chatter(sshd_cluster, tmp_path):
    cluster = sshd_cluster(1)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 5\n" +
                         cluster.inventory_yaml())
    ctl = ControllerProcess(tmp_path / "state", inventory).start()
    home = ctl.home
    job = queue_add(home, str(ROOT / "jobs/steps_progress.sh"), "6000", "0.1", "--retries", "1")

    def state():
        return jobs_by_id(home)[job]

    try:
        # Running, its progress read over SFTP every poll (paramiko's INFO lines, each time).
        wait_until(lambda: state()["observed_speed"] is not None, limit=120)
        cluster.stop("node01")
        wait_until(lambda: state()["state"] == "lost", limit=120)
        kill_attempt(job, "node01", home)           # it reboots: the attempt is gone...
        cluster.start("node01")                     # ...and it answers: requeued
        wait_until(lambda: state()["state"] == "running" and state()["attempts"] == 2,
                   limit=60)                        # its second attempt
        cli(home, "queue", "cancel", str(job), check=True)
        wait_until(lambda: state()["state"] == "cancelled", limit=120)
    finally:
        ctl.stop()
    log = ctl.log.read_text()
    name = f"job {job} (root/steps_progress.sh)"
    story = [
        f"controller started (pid {ctl.proc.pid}): inventory {inventory}, nodes node01",
        f"{name}: queued -> starting: placed on node01:0",
        f"{name}: starting -> running: running on node01:0",
        f"{name}: running -> lost: node node01 silent for over 5s",
        f"{name}: lost -> queued: its attempt on node01 ended without an exit code",
        f"{name}: queued -> starting: placed on node01:0",
        f"{name}: starting -> running: running on node01:0",
        f"{name}: running -> cancelled: cancelled by root",
        "controller stopping (SIGTERM); running jobs keep running on their nodes",
        "controller stopped",
    ]
    found = [line.split(": ", 1)[1] for line in log.splitlines()
             if any(line.split(": ", 1)[-1].startswith(s) for s in story)]
    assert [next(s for s in story if f.startswith(s)) for f in found] == story, log
    assert "sftp" not in log.lower(), log
    assert not re.search(r" INFO (?!iadeep\.)", log), log


def test_controller_refuses_to_start_without_an_inventory(tmp_path):
    """No file at all is a mistake (the lab's nodes would silently vanish); a file that
    says ``nodes: []`` is an empty cluster on purpose."""
    home = tmp_path / "state"
    proc = cli(home, "controller", "run")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"Error: {home / 'nodes.yaml'}: inventory file not found "
                               "(the default: no --inventory, no $IADEEP_INVENTORY)")
    assert "nodes: []" in lines[0]
    proc = cli(home, "controller", "run", IADEEP_INVENTORY=str(tmp_path / "lab.yaml"))
    assert f"{tmp_path / 'lab.yaml'}: inventory file not found (from $IADEEP_INVENTORY)" \
        in proc.stderr
    ctl = ControllerProcess(home).start()    # it writes 'nodes: []' to the state directory
    try:
        assert (home / "nodes.yaml").read_text() == "nodes: []\n"
    finally:
        ctl.stop()

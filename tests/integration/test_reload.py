"""`iadeep controller reload` and SIGHUP: a real controller re-reads its inventory while real
sshd nodes run its jobs; a broken file changes nothing (permissions:
tests/integration/test_permissions.py)."""
import json
import signal
from pathlib import Path

from helpers.controllers import ControllerProcess, cli, queue_add, wait_until
from helpers.reload_lab import LAB, LONG_JOB, job_row, start
from helpers.sshd import _descendants


def _status_nodes(home) -> dict:
    data = json.loads(cli(home, "status", "--json", check=True).stdout)
    assert data["live"]
    return {n["name"]: n["state"] for n in data["nodes"]}


def _one_line_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: "), \
        proc.stderr
    return lines[0]


def _broken(inventory: Path, cluster) -> int:
    """Write the two-node inventory with node02's port out of range; returns that line."""
    text = LAB + cluster.inventory_yaml().replace(f"port: {cluster.node('node02').port}",
                                                  "port: 99999")
    inventory.write_text(text)
    return text.splitlines().index("    port: 99999") + 1


def test_reload_adds_a_node_keeps_running_jobs_and_refuses_a_broken_file(sshd_cluster,
                                                                          tmp_path):
    cluster = sshd_cluster(2)
    inventory, ctl = start(cluster, tmp_path, ["node01"])
    home = ctl.home
    try:
        first = queue_add(home, *LONG_JOB, "--name", "first")
        wait_until(lambda: job_row(home, first)["state"] == "running", limit=120)
        second = queue_add(home, *LONG_JOB, "--name", "second")   # node01's only GPU is taken
        wait_until(lambda: job_row(home, second)["reason"], limit=120)
        before = job_row(home, first)

        line = _broken(inventory, cluster)
        error = _one_line_error(cli(home, "controller", "reload"))
        assert error.startswith(f"Error: {inventory}:{line}: nodes[1].port: expected a port "
                                "number from 1 to 65535, got 99999")
        # the old configuration runs on (a round whose poll was slow reads down for a while)
        wait_until(lambda: _status_nodes(home) == {"node01": "up"}, limit=120)
        assert job_row(home, second)["state"] == "queued"

        inventory.write_text(LAB + cluster.inventory_yaml())
        out = cli(home, "controller", "reload", check=True).stdout
        assert out == f"reloaded {inventory}: 2 nodes (added node02)\n"
        wait_until(lambda: job_row(home, second)["state"] == "running", limit=120)
        assert job_row(home, second)["node"] == "node02"
        after = job_row(home, first)                               # untouched by the reload
        assert (after["state"], after["node"], after["remote_pid"], after["attempts"]) == \
            ("running", "node01", before["remote_pid"], 1)
        wait_until(lambda: _status_nodes(home) == {"node01": "up", "node02": "up"})
        cli(home, "queue", "cancel", str(first), str(second), check=True)
        wait_until(lambda: {job_row(home, i)["state"] for i in (first, second)} == {"cancelled"},
                   limit=30)
    finally:
        ctl.stop()


def test_sighup_reloads_a_good_file_keeps_the_old_one_on_a_bad_one(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text(LAB + "nodes: []\n")                   # an empty cluster on purpose
    ctl = ControllerProcess(tmp_path / "state", inventory).start()
    home = ctl.home
    try:
        job = queue_add(home, *LONG_JOB)
        inventory.write_text(LAB + cluster.inventory_yaml(["node01"]))
        ctl.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: job_row(home, job)["state"] == "running", limit=120)
        assert job_row(home, job)["node"] == "node01"

        line = _broken(inventory, cluster)
        ctl.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "reload on SIGHUP refused" in ctl.log.read_text())
        assert f"the running configuration stays: {inventory}:{line}: nodes[1].port" in \
            ctl.log.read_text()
        assert ctl.proc.poll() is None
        wait_until(lambda: _status_nodes(home) == {"node01": "up"}, limit=120)

        # A node taken out: its connection closes, its job is lost (it may still run there).
        sshd = cluster.node("node01").proc.pid
        assert _descendants(sshd), "the controller should hold a connection to node01"
        inventory.write_text(LAB + "nodes: []\n")
        ctl.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: job_row(home, job)["state"] == "lost", limit=120)
        assert job_row(home, job)["reason"] == "node node01 is no longer in the inventory"
        wait_until(lambda: not _descendants(sshd), limit=120)
        wait_until(lambda: _status_nodes(home) == {})
    finally:
        ctl.stop()
        cluster.kill_jobs()


def test_reload_without_a_controller_says_so(tmp_path):
    error = _one_line_error(cli(tmp_path / "state", "controller", "reload"))
    assert "controller is not running" in error

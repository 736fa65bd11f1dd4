"""A node renamed in the inventory while its job runs (`controller reload`), with a real
controller and a real sshd node: the job follows the new name (still running, same process,
not lost), and an --exclusive job does not land on the GPU it holds."""

from helpers.controllers import cli, queue_add, wait_until
from helpers.reload_lab import LAB, LONG_JOB, job_row, start


def test_a_renamed_nodes_job_follows_it_and_keeps_its_gpu(sshd_cluster, tmp_path):
    cluster = sshd_cluster(1)
    inventory, ctl = start(cluster, tmp_path)
    home = ctl.home
    try:
        first = queue_add(home, *LONG_JOB, "--name", "first")
        wait_until(lambda: job_row(home, first)["state"] == "running", limit=60)
        before = job_row(home, first)

        inventory.write_text(LAB + cluster.inventory_yaml().replace("name: node01",
                                                                    "name: gpu-a"))
        out = cli(home, "controller", "reload", check=True).stdout
        assert out == f"reloaded {inventory}: 1 node (renamed node01 to gpu-a)\n"
        second = queue_add(home, *LONG_JOB, "--name", "second")
        # rounds under the new name have run: the second job was placed, or was told why not
        wait_until(lambda: job_row(home, second)["state"] != "queued"
                   or "waiting" in job_row(home, second)["reason"], limit=60)
        assert job_row(home, second)["state"] == "queued", job_row(home, second)
        after = job_row(home, first)
        assert (after["state"], after["node"], after["remote_pid"], after["attempts"]) == \
            ("running", "gpu-a", before["remote_pid"], 1)

        assert cli(home, "logs", str(first)).returncode == 0     # its directory is found
        cli(home, "queue", "cancel", str(first), check=True)
        wait_until(lambda: job_row(home, first)["state"] == "cancelled", limit=30)
        wait_until(lambda: job_row(home, second)["state"] == "running", limit=60)
        assert job_row(home, second)["node"] == "gpu-a"
        cli(home, "queue", "cancel", str(second), check=True)
        wait_until(lambda: job_row(home, second)["state"] == "cancelled", limit=30)
    finally:
        ctl.stop()


def test_a_removed_nodes_lost_job_can_be_fenced_by_its_old_name(sshd_cluster, tmp_path):
    """A node removed from the inventory while its job runs: the job is lost (it may still run
    there), and `nodes fence` takes the name no longer listed, to settle it."""
    cluster = sshd_cluster(2)
    inventory, ctl = start(cluster, tmp_path, ["node01"])
    home = ctl.home
    try:
        job = queue_add(home, *LONG_JOB, "--retries", "1")
        wait_until(lambda: job_row(home, job)["state"] == "running", limit=60)
        inventory.write_text(LAB + cluster.inventory_yaml(["node02"]))   # a different host
        out = cli(home, "controller", "reload", check=True).stdout
        assert "added node02; removed node01" in out
        wait_until(lambda: job_row(home, job)["state"] == "lost", limit=60)
        fenced = cli(home, "nodes", "fence", "node01", "--yes")
        assert fenced.returncode == 0, fenced.stderr
        assert str(job) in fenced.stdout
        wait_until(lambda: job_row(home, job)["state"] in ("starting", "running"), limit=60)
        assert job_row(home, job)["node"] == "node02"
    finally:
        cluster.kill_jobs()
        ctl.stop()

"""A job that could never run is refused when it is submitted, with the reason and a hint,
instead of waiting forever. Real controller processes, real sshd nodes, a real second account."""
import json
import socket

import pytest

from helpers.accounts import ALICE, cli_as, needs_root, sh_script, shared_dir
from helpers.controllers import ControllerProcess, cli, jobs_by_id, wait_until


@pytest.fixture
def shared(tmp_path):
    """A directory other accounts can reach, with a job script in it."""
    with shared_dir("iadeep-unrun-") as root:
        sh_script(root, "job.sh", "sleep 30")
        yield root


def _refused(out, message: str, hint: str) -> None:
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.startswith(f"Error: {message} (hint: {hint}") and out.stderr.count("\n") == 1


@pytest.mark.os_global   # creates a Unix account
@needs_root
def test_a_job_larger_than_every_node_is_refused_with_the_reason(sshd_cluster, shared):
    cluster = sshd_cluster(2)
    for node in cluster.nodes.values():
        node.set_fake(gpus=2)   # two H200s each: 140.4 GiB
    inventory = shared / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n"
                         f"  user_limits: {{{ALICE}: {{max_gpus: 1}}}}\n"
                         + cluster.inventory_yaml())
    ctl = ControllerProcess(shared / "state", inventory).start()
    try:
        def seen():
            nodes = json.loads(cli(ctl.home, "status", "--json").stdout)["nodes"]
            return len(nodes) == 2 and all(len(n["gpus"]) == 2 for n in nodes)
        wait_until(seen, limit=120, every=0.3)
        script = str(shared / "job.sh")
        _refused(cli(ctl.home, "queue", "add", script, "--gpus", "3"),
                 "the job needs 3 GPUs on one node; the largest node here has 2",
                 "ask for at most 2 with --gpus")
        _refused(cli(ctl.home, "queue", "add", script, "--gpu-mem", "200"),
                 "the job needs 200 GiB of GPU memory; the largest GPU here has 140.4 GiB",
                 "--gpu-mem is the memory one GPU of the job needs, in GiB")
        _refused(cli(ctl.home, "queue", "add", script, "--gpu-mem", "141", "--gpus", "2"),
                 "the job needs 141 GiB of GPU memory on each of 2 GPUs of one node; the "
                 "largest GPU here has 140.4 GiB", "--gpu-mem is the memory")
        fits = cli(ctl.home, "queue", "add", script, "--gpu-mem", "100", "--gpus", "2", check=True)
        # A user limit below what the job asks for can never be met either.
        alice = cli_as(ALICE, ctl.home, "queue", "add", script, "--gpus", "2")
        assert alice["rc"] == 1 and alice["err"].startswith(
            f"Error: the job needs 2 GPUs but {ALICE} may use at most 1 at once "
            "(lab.user_limits) (hint: ask for at most 1 with --gpus")
        assert cli_as(ALICE, ctl.home, "queue", "add", script)["rc"] == 0
        assert len(jobs_by_id(ctl.home)) == 2   # nothing refused was queued
        assert int(fits.stdout) in jobs_by_id(ctl.home)
    finally:
        ctl.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nodes_never_seen_refuse_only_what_the_inventory_says(shared):
    """A node the controller has never reached could hold anything, except more GPUs than
    its inventory entry lists."""
    script = str(shared / "job.sh")
    node = f"  - name: ghost\n    host: 127.0.0.1\n    port: {_closed_port()}\n"
    for gpus, refused in (("    gpus: [0, 1]\n", True), ("", False)):
        inventory = shared / "nodes.yaml"
        inventory.write_text(f"lab:\n  poll_interval: 0.3\nnodes:\n{node}{gpus}")
        ctl = ControllerProcess(shared / f"state{len(gpus)}", inventory).start()
        try:
            assert cli(ctl.home, "queue", "add", script, "--gpu-mem", "500").returncode == 0
            three = cli(ctl.home, "queue", "add", script, "--gpus", "3")
            if refused:
                _refused(three, "the job needs 3 GPUs on one node; the largest node here has 2",
                         "ask for at most 2")
            else:
                assert three.returncode == 0, three.stderr
        finally:
            ctl.stop()

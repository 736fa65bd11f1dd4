"""A job that kills its own wrapper (the session leader that records its exit code) on a real
sshd node: while anything of it runs it is reported running, so it is neither counted off its
GPU nor started a second time; once the last of it ends it is reported ended (no exit code)."""
from __future__ import annotations

import pytest
from test_launcher_sshd import make_job, pool  # noqa: F401  (the fixture)
from test_node_untrusted_sshd import running

from helpers.controllers import wait_until
from iadeep_cli.nodes.shell import backend as L

pytestmark = pytest.mark.sshd

KILLS_WRAPPER = """#!/bin/sh
kill -9 $PPID
echo wrapper-killed
while [ ! -e "$1" ]; do sleep 0.1; done
exit 5
"""


def test_a_job_that_kills_its_wrapper_runs_until_its_last_process_ends(pool, tmp_path):  # noqa: F811
    release = tmp_path / "release"
    job, script = make_job(tmp_path, 160, KILLS_WRAPPER, args=(str(release),))
    res = L.launch(pool, "node01", job, [0], script)
    wait_until(lambda: L.read_log(pool, "node01", 160).data == b"wrapper-killed\n")
    wait_until(lambda: not running(res.pid))               # the wrapper is gone
    expect = [(160, res.pid, res.start)]
    state = L.reconcile(pool, "node01", expect)[160]
    assert (state.state, state.pid) == ("running", res.pid)
    assert pool.poll("node01", expect=expect).jobs == ((160, state),)   # the same in a poll
    release.touch()
    wait_until(lambda: L.reconcile(pool, "node01", expect)[160].state == "exited")
    assert L.reconcile(pool, "node01", expect)[160] == L.RemoteJob("exited", None, res.pid)


def test_a_job_that_killed_its_wrapper_can_be_cancelled(pool, tmp_path):  # noqa: F811
    job, script = make_job(tmp_path, 161, KILLS_WRAPPER, args=(str(tmp_path / "never"),))
    res = L.launch(pool, "node01", job, [0], script)
    wait_until(lambda: not running(res.pid))
    expect = [(161, res.pid, res.start)]
    assert L.reconcile(pool, "node01", expect)[161].state == "running"
    assert L.cancel(pool, "node01", 161, grace_s=20) == "terminated"
    # no wrapper to record a code: the loop ends it `cancelled`, as it asked
    assert L.reconcile(pool, "node01", expect)[161] == L.RemoteJob("exited", None, res.pid)


def test_the_controller_keeps_a_job_that_killed_its_wrapper_running_and_runs_it_once(
        sshd_cluster, tmp_path):
    """Through a real controller, with a retry to spend: the job stays `running` on its first
    attempt while its process lives (it was `failed` or requeued, a second attempt started
    beside the first), and ends once, without an exit code, when its process does."""
    from helpers.controllers import ControllerProcess, jobs_by_id, queue_add

    cluster = sshd_cluster(1)
    cluster.node("node01").set_fake(gpus=2)   # the later job runs on the other
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 3\n"
                         + cluster.inventory_yaml())
    script = tmp_path / "kills_wrapper.sh"
    script.write_text(KILLS_WRAPPER)
    release, quick = tmp_path / "release", tmp_path / "quick.sh"
    quick.write_text("#!/bin/sh\nexit 0\n")
    ctl = ControllerProcess(tmp_path / "state", inventory).start()
    home = ctl.home

    def job(i):
        return jobs_by_id(home)[i]

    try:
        first = queue_add(home, str(script), str(release), "--retries", "1")
        wait_until(lambda: job(first)["state"] == "running" and job(first)["remote_pid"],
                   limit=60)
        wait_until(lambda: not running(job(first)["remote_pid"]), limit=60)   # wrapper gone
        # rounds have polled it since: a later job ran start to end on the same node
        later = queue_add(home, str(quick))
        wait_until(lambda: job(later)["state"] == "succeeded", limit=60)
        assert (job(first)["state"], job(first)["attempts"]) == ("running", 1), job(first)
        release.touch()
        wait_until(lambda: job(first)["state"] == "failed", limit=60)
        assert job(first)["attempts"] == 2   # its retry ran once its first attempt had ended
    finally:
        release.touch()
        ctl.stop()

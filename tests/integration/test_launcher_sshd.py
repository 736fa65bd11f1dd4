"""Jobs on a real sshd node: quoting, detach, idempotent launch, cancel, reconcile, logs."""
from __future__ import annotations

import pytest

from iadeep_cli.errors import NotFoundError
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.nodes.poller import NodePool
from iadeep_cli.nodes.shell import backend as L

pytestmark = pytest.mark.sshd

ECHO = """#!/bin/sh
for a in "$@"; do printf 'ARG<%s>\\n' "$a"; done
for v in IADEEP_JOB_ID IADEEP_JOB_NAME IADEEP_PROGRESS_FILE CUDA_VISIBLE_DEVICES TRICKY; do
  eval "printf '%s<%s>\\n' $v \\"\\$$v\\""
done
printf 'PWD<%s>\\n' "$(pwd)"
"""
TRICKY = ("a b", "$(touch /tmp/iadeep-pwned)", "x;y", "q'u\"o`t`e", "new\nline", "", "*")


from test_node_untrusted_sshd import running  # noqa: E402

from helpers.controllers import wait_until  # noqa: E402


def make_job(tmp_path, job_id, body, **spec):
    script = tmp_path / f"job{job_id}.sh"
    script.write_text(body)
    return Job(job_id, "alice", JobSpec(str(script), **spec), JobState.STARTING, 0.0), script


@pytest.fixture
def pool(sshd_cluster):
    c = sshd_cluster(2, key="jobs")
    with NodePool(c.inventory, connect_timeout=3, command_timeout=10, backoff_base=0) as p:
        yield p


def finished(pool, job_id):
    return L.reconcile(pool, "node01", [job_id])[job_id].state == "exited"


def test_user_values_reach_the_job_exactly(pool, tmp_path):
    env = (("TRICKY", "v $HOME '\"; $(id) `id`\nnext"),)
    job, script = make_job(tmp_path, 101, ECHO, args=TRICKY, name="n'a;m e$(x)", env=env,
                           workdir=str(tmp_path))
    res = L.launch(pool, "node01", job, [1, 3], script)
    wait_until(lambda: finished(pool, 101))
    log = L.read_log(pool, "node01", 101).data
    want = "".join(f"ARG<{a}>\n" for a in TRICKY) + "".join(
        f"{k}<{v}>\n" for k, v in (("IADEEP_JOB_ID", "101"), ("IADEEP_JOB_NAME", job.name),
                                   ("IADEEP_PROGRESS_FILE", f"{res.job_dir}/progress"),
                                   ("CUDA_VISIBLE_DEVICES", "1,3"), ("TRICKY", env[0][1]),
                                   ("PWD", str(tmp_path))))
    assert log.decode() == want
    assert L.reconcile(pool, "node01", [101])[101].exit_code == 0
    _, out, _ = pool.run("node01", ["stat", "-c", "%a", res.job_dir])
    assert out.strip() == "700"


def test_launch_is_idempotent_and_detached(pool, tmp_path):
    job, script = make_job(tmp_path, 102, "#!/bin/sh\necho started\nsleep 30\n")
    first = L.launch(pool, "node01", job, [0], script)
    pool.connection("node01").close()           # the controller's connection goes away
    second = L.launch(pool, "node01", job, [0], script)
    assert not first.already_started and second.already_started
    assert second.pid == first.pid == first.pgid
    state = L.reconcile(pool, "node01", [102])[102]
    assert (state.state, state.pid) == ("running", first.pid)
    snap = pool.poll("node01")
    tagged = [p for g in snap.gpus for p in g.processes if p.job_id == 102]
    assert tagged and not any(p.job_id == 102 for p in snap.gpus[0].foreign_processes)
    assert L.cancel(pool, "node01", 102, grace_s=20) == "terminated"
    assert L.reconcile(pool, "node01", [102])[102] == L.RemoteJob("exited", 143, first.pid)


def test_cancel_kills_after_grace(pool, tmp_path):
    job, script = make_job(tmp_path, 103, "#!/bin/sh\ntrap '' TERM\necho ready\n"
                                          "while :; do sleep 0.1; done\n")
    res = L.launch(pool, "node01", job, [0], script)
    wait_until(lambda: L.read_log(pool, "node01", 103).data == b"ready\n")
    assert L.cancel(pool, "node01", 103, grace_s=0.5) == "killed"
    assert L.reconcile(pool, "node01", [103])[103] == L.RemoteJob("exited", 137, res.pid)
    assert L.cancel(pool, "node01", 103, grace_s=0.5) == "not-running"


def test_reconcile_exit_codes_and_missing(pool, tmp_path):
    job, script = make_job(tmp_path, 104, "#!/bin/sh\nexit 3\n")
    L.launch(pool, "node01", job, [0], script)
    wait_until(lambda: finished(pool, 104))
    got = L.reconcile(pool, "node01", [104, 105])
    assert got[104].exit_code == 3 and got[105] == L.RemoteJob("missing")
    assert L.cancel(pool, "node01", 105) == "missing"


def test_an_interrupted_launch_is_reported_claimed_and_never_restarted(pool, tmp_path):
    """The controller died after claiming the job dir but before the pid was recorded."""
    job, script = make_job(tmp_path, 107, "#!/bin/sh\nexit 0\n")
    d = L.job_dir(pool.node("node01").workdir, 107)
    pool.run("node01", ["sh", "-c", f"mkdir -p {d} && : > {d}/launched"])
    assert L.reconcile(pool, "node01", [107])[107] == L.RemoteJob("claimed")
    with pytest.raises(Exception, match="claimed by another launch"):
        L.launch(pool, "node01", job, [0], script)
    L.set_aside(pool, "node01", 107, "lost1")   # what the controller does before a retry
    assert L.reconcile(pool, "node01", [107])[107] == L.RemoteJob("missing")
    assert not L.launch(pool, "node01", job, [0], script).already_started
    wait_until(lambda: finished(pool, 107))


def test_read_log_offsets(pool, tmp_path):
    job, script = make_job(tmp_path, 106, "#!/bin/sh\nprintf 'abcdefghij'\n")
    L.launch(pool, "node01", job, [0], script)
    wait_until(lambda: finished(pool, 106))
    a = L.read_log(pool, "node01", 106, 0, 4)
    b = L.read_log(pool, "node01", 106, a.offset, 100)
    c = L.read_log(pool, "node01", 106, b.offset, 100)
    assert (a.data + b.data, a.offset, b.offset, c.data, c.offset) == (b"abcdefghij", 4, 10,
                                                                       b"", 10)
    assert a.size == b.size == c.size == 10
    with pytest.raises(NotFoundError):
        L.read_log(pool, "node01", 999)


@pytest.mark.parametrize("name", ["exit", "pid", "log", "launched", "progress"])
def test_a_script_named_like_a_control_file_runs_normally(pool, tmp_path, name):
    job_id = 120 + ["exit", "pid", "log", "launched", "progress"].index(name)
    script = tmp_path / name
    script.write_text("#!/bin/sh\necho 7 exited 1 0\nexit 4\n")
    job = Job(job_id, "alice", JobSpec(str(script)), JobState.STARTING, 0.0)
    assert not L.launch(pool, "node01", job, [0], script).already_started
    wait_until(lambda: finished(pool, job_id))
    assert L.reconcile(pool, "node01", [job_id])[job_id].exit_code == 4
    assert L.read_log(pool, "node01", job_id).data == b"7 exited 1 0\n"


def test_a_reused_pid_is_not_mistaken_for_the_job(pool, tmp_path):
    """After a reboot the recorded pid may lead someone else's session: its start time differs,
    so reconcile must not call the job running and cancel must not kill that stranger."""
    job, script = make_job(tmp_path, 130, "#!/bin/sh\nsleep 30\n")
    res = L.launch(pool, "node01", job, [0], script)
    wait_until(lambda: L.reconcile(pool, "node01", [130])[130].state == "running")
    d = L.job_dir(pool.node("node01").workdir, 130)
    _, real, _ = pool.run("node01", ["cat", f"{d}/pid"])
    pid, start = real.split()
    assert int(pid) == res.pid and start.isdigit()
    pool.run("node01", ["sh", "-c", f"echo '{pid} 1' > {d}/pid"])   # same pid, other process
    assert L.reconcile(pool, "node01", [130])[130] == L.RemoteJob("exited", None, res.pid)
    # A real stranger in that pid file: cancel leaves it alone, and still finds the job by the
    # tags in its environment.
    _, stranger, _ = pool.run("node01", ["sh", "-c", "setsid sleep 30 >/dev/null 2>&1 & echo $!"])
    pool.run("node01", ["sh", "-c", f"echo '{stranger.strip()} 1' > {d}/pid"])
    try:
        assert L.cancel(pool, "node01", 130, grace_s=20) == "terminated"
        assert pool.run("node01", ["kill", "-0", stranger.strip()])[0] == 0   # lives on
        assert not running(int(pid))
    finally:
        pool.run("node01", ["kill", stranger.strip()])

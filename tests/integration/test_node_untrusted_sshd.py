"""What a job leaves on its node is untrusted input: real sshd nodes, jobs that fight back.

A job that escapes into its own session or deletes its pid file is still stopped; a log that is
a FIFO, a link to /dev/zero or a directory is refused with a clear error, reads are bounded and
time out, and none of it costs the node its SSH connection (a poll right after still works).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from pathlib import Path

import pytest
from test_ssh_hostkeys import iadeep

from helpers.controllers import wait_until
from helpers.sshd import _descendants, proc_files
from iadeep_cli.errors import InputError, NodeError
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.nodes.poller import NodePool
from iadeep_cli.nodes.shell import backend as L

pytestmark = pytest.mark.sshd


def running(pid: int) -> bool:
    """Alive and not a zombie (the test nodes share this machine's /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def tagged(pool, job_id: int) -> list[int]:
    """Live processes whose environment carries IADEEP_JOB_ID=job_id, launched under this
    test's cluster's workdir (another test, or another pytest-xdist worker, may run a job with
    the same id at the same time)."""
    want = f"IADEEP_JOB_ID={job_id}".encode()
    under = f"IADEEP_PROGRESS_FILE={pool.cluster.workdir}/".encode()
    found = []
    for env in proc_files("environ"):
        try:
            environ = env.read_bytes().split(b"\0")
            if (want in environ and any(e.startswith(under) for e in environ)
                    and running(int(env.parent.name))):
                found.append(int(env.parent.name))
        except OSError:
            continue
    return found


def launch(pool, tmp_path, job_id: int, body: str, node: str = "node01") -> str:
    script = tmp_path / f"job{job_id}.sh"
    script.write_text(body)
    job = Job(job_id, "alice", JobSpec(str(script)), JobState.STARTING, 0.0)
    return L.launch(pool, node, job, [0], script).job_dir


def reconfigured(cluster, name: str, pattern: str, replacement: str):
    """Restart ``name``'s sshd with one line of its config changed (this cluster key only)."""
    node = cluster.node(name)
    node.config.write_text(re.sub(pattern, replacement, node.config.read_text(), flags=re.M))
    node.stop()
    node.start()
    return node


@pytest.fixture
def pool(sshd_cluster):
    c = sshd_cluster(1, key="untrusted")
    with NodePool(c.inventory, connect_timeout=3, command_timeout=10, backoff_base=0) as p:
        p.cluster = c
        yield p


# A job that escapes: it ignores TERM, forks a daemon into a session of its own, then deletes
# its pid file (waiting for it first: launch writes it just after starting the job).
ESCAPE = """#!/bin/sh
trap "" TERM
d=$(dirname "$IADEEP_PROGRESS_FILE")
setsid sh -c 'trap "" TERM; exec sleep 300' </dev/null >/dev/null 2>&1 &
while [ ! -f "$d/pid" ]; do sleep 0.05; done
rm -f "$d/pid"
echo ready
exec sleep 300
"""


def test_cancel_stops_a_setsid_daemon_of_a_job_that_deleted_its_pid_file(pool, tmp_path):
    launch(pool, tmp_path, 401, ESCAPE)
    wait_until(lambda: L.read_log(pool, "node01", 401).data == b"ready\n")
    escaped = tagged(pool, 401)
    assert len(escaped) >= 3          # the wrapper, the job's sleep, the daemon (own session)
    assert L.cancel(pool, "node01", 401, grace_s=1) == "killed"   # TERM was ignored
    assert tagged(pool, 401) == [] and not any(running(p) for p in escaped)
    assert L.cancel(pool, "node01", 401, grace_s=1) == "missing"   # no pid file, nothing left
    assert pool.poll("node01").ok


def test_the_end_of_a_job_stops_what_it_left_running(pool, tmp_path):
    launch(pool, tmp_path, 402, "#!/bin/sh\nsetsid sleep 300 </dev/null >/dev/null 2>&1 &\n"
                                "sleep 300 &\necho bye\n")
    wait_until(lambda: L.reconcile(pool, "node01", [402])[402].state == "exited")
    assert L.reconcile(pool, "node01", [402])[402].exit_code == 0
    assert tagged(pool, 402) == []    # both leftovers were gone before the exit code was written


def test_cancel_never_touches_another_installs_job_with_the_same_id(pool, tmp_path):
    """Job ids restart with a new database: only processes tagged with this job's directory
    are this job's."""
    inventory = pool.cluster.inventory
    nodes = tuple(dataclasses.replace(n, workdir=n.workdir + "/other-install")
                  for n in inventory.nodes)
    with NodePool(dataclasses.replace(inventory, nodes=nodes), connect_timeout=3,
                  command_timeout=10, backoff_base=0) as other:
        launch(other, tmp_path, 403, "#!/bin/sh\nexec sleep 300\n")
        launch(pool, tmp_path, 403, "#!/bin/sh\nexec sleep 300\n")
        wait_until(lambda: len(tagged(pool, 403)) == 4)   # a wrapper and a sleep each
        theirs = [p for p in tagged(pool, 403)
                  if b"other-install" in Path(f"/proc/{p}/environ").read_bytes()]
        assert L.cancel(pool, "node01", 403, grace_s=20) == "terminated"
        assert tagged(pool, 403) == theirs
        assert L.cancel(other, "node01", 403, grace_s=20) == "terminated"


def test_clean_finished_removes_only_those_jobs_dirs(pool, tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep").write_text("x")
    d = launch(pool, tmp_path, 13, f"#!/bin/sh\nln -s {outside} link\n")
    wait_until(lambda: L.reconcile(pool, "node01", [13])[13].state == "exited")
    L.set_aside(pool, "node01", 13, "lost1")
    L.set_aside(pool, "node01", 13, "lost1")    # nothing there now: a no-op
    launch(pool, tmp_path, 13, "#!/bin/sh\nln -s " + str(outside) + " \"$PWD/../13.evil\"\n")
    launch(pool, tmp_path, 130, "#!/bin/sh\nexit 0\n")   # "13.*" must not reach 130
    wait_until(lambda: all(r.state == "exited" for r in
                           L.reconcile(pool, "node01", [13, 130]).values()))
    jobs = Path(d).parent

    def ours() -> list[str]:
        return sorted(p.name.split(".")[0] for p in jobs.iterdir() if p.name.startswith("13"))
    assert ours() == ["13", "13", "13", "130"]     # 13, 13.lost1.*, 13.evil (a link), 130
    L.clean_finished(pool, "node01", [13])
    assert ours() == ["130"]
    assert (outside / "keep").read_text() == "x"
    with pytest.raises(InputError):
        L.clean_finished(pool, "node01", ["13; rm -rf ~"])
    L.clean_finished(pool, "node01", [13, 999])   # already gone: nothing to do


def test_clean_finished_refuses_a_jobs_dir_that_is_a_symlink(pool, tmp_path):
    decoy = tmp_path / "decoy"
    (decoy / "14").mkdir(parents=True)
    jobs = Path(L.job_dir(pool.node("node01").workdir, 14)).parent
    jobs.parent.mkdir(parents=True, exist_ok=True)
    moved = jobs.parent / "jobs.real"
    if jobs.exists():
        jobs.rename(moved)
    jobs.symlink_to(decoy)
    try:
        with pytest.raises(NodeError, match="symbolic link"):
            L.clean_finished(pool, "node01", [14])
        assert (decoy / "14").is_dir()
    finally:
        jobs.unlink()
        if moved.exists():
            moved.rename(jobs)


# ------------------------------------------------------------------------------ GPU values
def test_a_node_reporting_garbage_reads_as_not_available(pool):
    """The stand-in nvidia-smi's ``hostile`` mode: NaN, Infinity, negative and absurd values, a
    terminal escape in the name, pids that are not pids."""
    pool.cluster.node("node01").set_fake(mode="hostile")
    snap = pool.poll("node01")
    assert snap.ok, snap.error
    (g,) = snap.gpus
    assert (g.memory_used_mib, g.memory_free_mib, g.utilization_gpu, g.utilization_memory,
            g.temperature_c, g.power_draw_w, g.power_limit_w) == (None,) * 7
    assert g.memory_total_mib == 143771 and g.name == "NVIDIA H200?[2J"
    # the fixture's 14 processes (pids 450-463) less the 3 whose pid is not a pid; the stand-in
    # also lists any iadeep job running on this machine
    fixture = [p for p in g.processes if 450 <= p.pid <= 463]
    assert len(fixture) == 14 - 3 and all(p.pid > 0 for p in g.processes)
    assert sum(p.used_memory_mib is None for p in fixture) == 2
    # pmon's NaN, -5, 1e400, inf, a pid that is not a pid and a cut row: no figure, and the
    # capture's sound rows still read
    assert all(p.sm_util is None or 0 <= p.sm_util <= 100 for p in g.processes)
    assert {p.pid: p.sm_util for p in fixture}[458] == 17.0
    res = iadeep("nodes", "check", "--inventory", str(pool.cluster.inventory_path), "--json")
    assert res.returncode == 0, res.stderr
    (node,) = json.loads(res.stdout, parse_constant=lambda token: pytest.fail(token))
    assert node["gpus"][0]["utilization_gpu"] is None and "\x1b" not in res.stdout


# ------------------------------------------------------------------------------ logs
def log_path(pool, job_id: int) -> str:
    d = L.job_dir(pool.node("node01").workdir, job_id)
    Path(d).mkdir(parents=True, exist_ok=True)
    return f"{d}/log"


def sftp_servers(cluster, name: str = "node01") -> list[int]:
    """The node's sftp-server processes still running (one that exits while looked at is
    not)."""
    node = cluster.node(name)
    found = []
    for p in _descendants(node.proc.pid):
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() == "sftp-server" and running(p):
                found.append(p)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


@pytest.mark.parametrize("kind, make", [
    ("FIFO", os.mkfifo),
    ("symbolic link", lambda path: Path(path).symlink_to("/dev/zero")),
    ("directory", lambda path: Path(path).mkdir()),
])
def test_a_log_that_is_not_a_regular_file_is_refused(pool, kind, make):
    job_id = 410 + ["FIFO", "symbolic link", "directory"].index(kind)
    make(log_path(pool, job_id))
    with pytest.raises(NodeError, match=f"is a {kind}, not a regular file"):
        L.read_log(pool, "node01", job_id, 0, 2 ** 31)
    assert pool.poll("node01").ok
    wait_until(lambda: sftp_servers(pool.cluster) == [])      # none left blocked


def test_a_huge_read_is_capped(pool):
    path = Path(log_path(pool, 420))
    path.write_bytes(b"x" * (3 * L.MAX_LOG_READ + 5))
    chunk = L.read_log(pool, "node01", 420, 0, 2 ** 31)
    assert (len(chunk.data), chunk.offset, chunk.size) == (L.MAX_LOG_READ, L.MAX_LOG_READ,
                                                           3 * L.MAX_LOG_READ + 5)
    tail = L.read_log(pool, "node01", 420, chunk.size - 5, 2 ** 31)
    assert (tail.data, tail.offset) == (b"xxxxx", chunk.size)


def test_a_cut_utf8_character_comes_whole_with_the_next_read(pool):
    Path(log_path(pool, 421)).write_bytes("aé€😀\n".encode())
    text, offset, _ = L.read_log(pool, "node01", 421, 0, 4).text()   # 'a', 'é', half of '€'
    rest, _, _ = L.read_log(pool, "node01", 421, offset, 100).text()
    assert (text, offset, rest) == ("aé", 3, "€😀\n")


def test_thirty_concurrent_reads_keep_the_connection_up(sshd_cluster):
    """sshd's default MaxSessions (10): past it, channels are refused; before the bound, a
    refused SFTP channel dropped the connection under every read in flight."""
    cluster = sshd_cluster(1, key="maxsessions")
    reconfigured(cluster, "node01", r"^MaxSessions .*$", "MaxSessions 10")
    with NodePool(cluster.inventory, connect_timeout=3, command_timeout=20,
                  backoff_base=0) as pool:
        Path(log_path(pool, 430)).write_bytes(b"y" * 300_000)
        os.mkfifo(log_path(pool, 431))
        transport = pool.connection("node01").client().get_transport()
        results: list = [None] * 30

        def read(i: int) -> None:
            try:
                results[i] = len(L.read_log(pool, "node01", 430 + i % 2, 0, 2 ** 31).data)
            except NodeError as exc:
                results[i] = exc.message
        threads = [threading.Thread(target=read, args=(i,)) for i in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results[0::2] == [300_000] * 15
        assert all("is a FIFO" in r for r in results[1::2])
        assert pool.connection("node01").client().get_transport() is transport
        assert pool.poll("node01").ok


def test_a_hung_sftp_server_times_out_uploads_and_the_node_stays_usable(sshd_cluster, tmp_path):
    """Uploads go over SFTP, bounded per node; log reads do not (they stay readable)."""
    cluster = sshd_cluster(1, key="sftp-hang")
    reconfigured(cluster, "node01", r"^Subsystem sftp .*$", "Subsystem sftp /bin/sleep 30")
    with NodePool(cluster.inventory, connect_timeout=3, command_timeout=1,
                  backoff_base=0) as pool:
        Path(log_path(pool, 440)).write_text("hello\n")
        local = tmp_path / "script.sh"
        local.write_text("#!/bin/sh\n")
        remote = f"{Path(log_path(pool, 441)).parent}/script.sh"
        errors: list = []

        def upload() -> None:
            try:
                pool.connection("node01").put(local, remote)
            except NodeError as exc:
                errors.append(exc.message)
        threads = [threading.Thread(target=upload) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Each waits for a session slot at most as long as for an answer: some may give up there.
        assert len(errors) == 6, errors
        assert all("no answer within 1 s" in e or "already in progress" in e for e in errors)
        assert sum("no answer within 1 s" in e for e in errors) >= 4
        assert L.read_log(pool, "node01", 440).data == b"hello\n"
        assert pool.poll("node01").ok


def test_a_refused_session_fails_only_its_own_command_never_those_in_flight(sshd_cluster):
    """sshd refuses a channel past its MaxSessions (channels still closing count too). That
    refusal is the new command's alone: it is tried again, and if still refused fails by
    itself; the connection, and the command already running on it, go on. (The refused
    command's tries take ~0.6 s; the one in flight sleeps 6 s.)"""
    cluster = sshd_cluster(1, key="maxsessions1")
    reconfigured(cluster, "node01", r"^MaxSessions .*$", "MaxSessions 1")
    with NodePool(cluster.inventory, connect_timeout=3, command_timeout=20,
                  backoff_base=0) as pool:
        conn = pool.connection("node01")
        conn.run("true")   # connected
        transport = conn.client().get_transport()
        got: dict = {}

        mark = f"long-done-{os.getpid()}-{threading.get_ident()}"   # this test's own

        def long() -> None:
            got["long"] = conn.run(["sh", "-c", f"sleep 6; echo {mark}"])

        t = threading.Thread(target=long)
        t.start()
        wait_until(lambda: any(mark in " ".join(p) for p in _sh_commands()), limit=60)
        with pytest.raises(NodeError, match="refused a new session"):
            conn.run(["echo", "refused"])
        t.join()
        assert got["long"][0] == 0 and got["long"][1] == f"{mark}\n"
        assert conn.client().get_transport() is transport and transport.is_active()


def _sh_commands() -> list[list[str]]:
    """Every process's argv on this machine (the sshd nodes run here)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                out.append((proc / "cmdline").read_bytes().decode(errors="replace").split("\0"))
            except OSError:
                pass
    return out

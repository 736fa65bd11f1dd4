"""The ``Backend`` contract (iadeep_cli/nodes/backend.py), checked against every real backend:
the shell's on a real sshd node, and Slurm's on the real Slurm (os_global: run these under
``flock /tmp/iadeep-os-global.lock``). A third backend adds its rig here (docs/backends.md).

Each test drives only the ``Backend`` a pool hands out, as the controller does, and reads what
is really there: the states the backend reports, the job's log, and /proc (both backends run
their jobs on this machine)."""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.controllers import process_states, wait_until
from iadeep_cli.errors import InputError, NodeError, NotFoundError
from iadeep_cli.jobs import MAX_INPUT, Job, JobSpec, JobState
from iadeep_cli.nodes.backend import Backend, LaunchResult, Stopped
from iadeep_cli.snapshot import RemoteState

# Waits for the file named by its first argument; says where it is, then that it is done.
WAITS = ('#!/bin/sh\necho "started $IADEEP_JOB_ID"\n'
         'while [ ! -e "$1" ]; do sleep 0.1; done\necho done\n')
# Says it is ready once its trap is set; on USR1, says so and exits 7.
TRAPS = ('#!/bin/sh\ntrap \'echo got-usr1; exit 7\' USR1\necho ready\n'
         'while :; do sleep 0.1; done\n')


@dataclass
class Rig:
    """One real backend of one node, with a directory its jobs' owner can use."""

    backend: Backend
    owner: str
    work: Path        # owned by ``owner``: scripts, the files jobs wait for, --chdir
    node: str
    first_id: int     # job ids of this rig start here (unlikely to meet another test's)

    def job(self, n: int, body: str, *args: str, exclusive: bool = False) -> tuple[Job, Path]:
        job_id = self.first_id + n
        script = self.work / f"job{job_id}.sh"
        script.write_text(body)
        script.chmod(0o755)
        shutil.chown(script, self.owner)
        spec = JobSpec(str(script), name=f"contract-{n}", args=args, workdir=str(self.work),
                       exclusive=exclusive, workload="contract")
        return Job(job_id, self.owner, spec, JobState.STARTING, time.time(), node=self.node,
                   attempts=1), script

    def state(self, got: LaunchResult | None, job: Job):
        expect = (job.id, got.pid if got else None, got.start if got else None)
        return self.backend.states([expect], owner=self.owner)[job.id]

    def log(self, job: Job) -> str:
        """The job's output so far; '' while there is none (NotFoundError: not started yet)."""
        try:
            return self.backend.read_log(job.id, owner=self.owner, job=job).data.decode()
        except NotFoundError:
            return ""

    def processes(self, job: Job) -> list[int]:
        """pids whose environment says they are this job's (IADEEP_JOB_ID and a progress file
        in this rig's node: the shell's job directory, or Slurm's --chdir)."""
        want = f"IADEEP_JOB_ID={job.id}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if want in env and any(e.startswith(b"IADEEP_PROGRESS_FILE=") and
                                   self.marker in e for e in env):
                found.append(int(proc.name))
        return found

    marker: bytes = b""


@pytest.fixture
def shell_rig(sshd_cluster, tmp_path) -> Iterator[Rig]:
    from iadeep_cli.nodes.poller import NodePool

    cluster = sshd_cluster(1, key="contract")
    with NodePool(cluster.inventory, connect_timeout=3, command_timeout=10,
                  backoff_base=0) as pool:
        owner = pwd_name(os.getuid())
        rig = Rig(pool.backend("node01"), owner, tmp_path, "node01",
                  secrets.randbelow(10 ** 6) * 100 + 10 ** 8)
        rig.marker = cluster.workdir.encode()
        yield rig


@pytest.fixture
def slurm_rig(slurm_cluster) -> Iterator[Rig]:
    from helpers.accounts import ensure_user
    from helpers.slurm import USER
    from iadeep_cli.inventory import parse_inventory
    from iadeep_cli.nodes.slurm import SlurmPool, with_slurm_nodes

    ensure_user(USER)
    root = Path(tempfile.mkdtemp(prefix="iadeep-contract-", dir="/tmp"))
    os.chmod(root, 0o755)
    work = root / "work"
    work.mkdir()
    shutil.chown(work, USER)
    inventory = with_slurm_nodes(parse_inventory(slurm_cluster.inventory(), root / "nodes.yaml"))
    pool = SlurmPool(inventory, None, f"contract{secrets.token_hex(2)}", lambda ids: {})
    rig = Rig(pool.backend(slurm_cluster.node), USER, work, slurm_cluster.node,
              secrets.randbelow(10 ** 6) * 100 + 10 ** 8)
    rig.marker = str(work).encode()
    try:
        yield rig
    finally:
        slurm_cluster.run("scancel", "--full", "-u", USER)
        wait_until(lambda: not slurm_cluster.run("squeue", "-h", "-u", USER, "-t", "R,CG,PD,S"),
                   limit=120)
        shutil.rmtree(root, ignore_errors=True)


def pwd_name(uid: int) -> str:
    import pwd
    return pwd.getpwuid(uid).pw_name


@pytest.fixture(params=[pytest.param("shell", marks=pytest.mark.sshd),
                        pytest.param("slurm", marks=pytest.mark.os_global)])
def rig(request) -> Rig:
    return request.getfixturevalue(f"{request.param}_rig")


def running(rig: Rig, got: LaunchResult, job: Job) -> bool:
    return rig.state(got, job).state == RemoteState.RUNNING


# ------------------------------------------------------------------------------ the contract
def test_launch_runs_the_job_once_and_states_follow_it_to_its_end(rig):
    """launch, then states say running (pending first only where the backend queues jobs);
    a second launch of the attempt finds the first and starts nothing; the job's output is
    readable; once it ends, states say exited with its exit code."""
    job, _ = rig.job(1, WAITS, str(rig.work / "go-1"))
    assert rig.state(None, job).state == RemoteState.MISSING   # never launched
    got = rig.backend.launch(job, (0,), job.spec.script)
    assert not got.already_started and got.waiting == rig.backend.keeps_jobs_pending
    first = rig.state(got, job).state
    assert first in ((RemoteState.RUNNING, RemoteState.PENDING)
                     if rig.backend.keeps_jobs_pending else (RemoteState.RUNNING,))
    wait_until(lambda: running(rig, got, job), limit=120)
    again = rig.backend.launch(job, (0,), job.spec.script)
    assert again.already_started and again.pid == got.pid
    wait_until(lambda: f"started {job.id}" in rig.log(job), limit=120)
    (rig.work / "go-1").touch()
    ended = wait_until(lambda: (s := rig.state(got, job)).state == RemoteState.EXITED and s,
                       limit=120)
    assert ended.exit_code == 0
    assert rig.log(job).endswith("done\n")


def test_cancel_stops_the_job_and_is_safe_again_and_on_a_job_never_launched(rig):
    job, _ = rig.job(2, WAITS, str(rig.work / "never"))
    assert rig.backend.cancel(job.id, grace_s=2, owner=rig.owner) == Stopped.MISSING
    got = rig.backend.launch(job, (0,), job.spec.script)
    wait_until(lambda: running(rig, got, job), limit=120)
    assert rig.backend.cancel(job.id, grace_s=2, owner=rig.owner) in (Stopped.TERMINATED,
                                                                      Stopped.KILLED)
    wait_until(lambda: rig.state(got, job).state == RemoteState.EXITED, limit=120)
    wait_until(lambda: not process_states(rig.processes(job)), limit=120)
    # again, once it ended (a controller repeating a stop after a crash): nothing to stop
    assert rig.backend.cancel(job.id, grace_s=2, owner=rig.owner) in (Stopped.NOT_RUNNING,
                                                                      Stopped.MISSING)


def test_signal_reaches_the_job_once(rig):
    job, _ = rig.job(3, TRAPS)
    assert rig.backend.signal(job.id, "USR1", owner=rig.owner) is False   # nothing there
    with pytest.raises(InputError):
        rig.backend.signal(job.id, "KILL;id", owner=rig.owner)
    got = rig.backend.launch(job, (0,), job.spec.script)
    wait_until(lambda: running(rig, got, job) and "ready" in rig.log(job), limit=120)
    assert rig.backend.signal(job.id, "USR1", owner=rig.owner) is True
    ended = wait_until(lambda: (s := rig.state(got, job)).state == RemoteState.EXITED and s,
                       limit=120)
    assert ended.exit_code == 7 and rig.log(job).count("got-usr1") == 1


def test_an_interrupt_reaches_a_job_that_does_not_trap_it(rig):
    """SIGINT (--signal INT, Ctrl-C in `iadeep run --pty`) ends a job that leaves it at its
    default, as in a terminal: no backend starts jobs with it ignored."""
    job, _ = rig.job(10, '#!/bin/sh\necho ready\nsleep 600\necho not-interrupted\n')
    got = rig.backend.launch(job, (0,), job.spec.script)
    wait_until(lambda: running(rig, got, job) and "ready" in rig.log(job), limit=120)
    assert rig.backend.signal(job.id, "INT", owner=rig.owner) is True
    ended = wait_until(lambda: (s := rig.state(got, job)).state == RemoteState.EXITED and s,
                       limit=120)
    assert ended.exit_code != 0 and "not-interrupted" not in rig.log(job)


def test_write_input_reaches_an_interactive_jobs_terminal_or_says_there_is_none(rig):
    """With ``interactive``: keystrokes reach the terminal of a job run by `iadeep run
    --pty`'s script (never before it made one), at most ``MAX_INPUT`` bytes at once; without:
    NodeError, always."""
    from iadeep_cli.cli.runpty import pty_script

    job, _ = rig.job(11, pty_script(["sh", "-c", "read x; echo got-$x-$((6*7))"], 24, 80,
                                   "xterm").decode())
    with pytest.raises(NodeError):
        rig.backend.write_input(job, b"never\r")   # not started: no terminal yet
    if not rig.backend.interactive:
        return
    got = rig.backend.launch(job, (0,), job.spec.script)
    wait_until(lambda: running(rig, got, job), limit=120)
    # the one bound on what is typed at once (the controller relies on it): refused whole
    with pytest.raises(InputError, match=f"^at most {MAX_INPUT} bytes of input at once, got "
                                         f"{MAX_INPUT + 1}$"):
        rig.backend.write_input(job, b"x" * (MAX_INPUT + 1))

    def typed() -> bool:
        try:
            rig.backend.write_input(job, b"hello\r")
            return True
        except NodeError:   # the script has not made its FIFO yet
            return False
    wait_until(typed, limit=120)
    ended = wait_until(lambda: (s := rig.state(got, job)).state == RemoteState.EXITED and s,
                       limit=120)
    assert ended.exit_code == 0 and "got-hello-42" in rig.log(job)
    with pytest.raises(NodeError):
        rig.backend.write_input(job, b"late\r")   # it ended: nobody reads


def test_suspend_stops_every_process_and_resume_continues_them_repeatably(rig):
    job, _ = rig.job(4, WAITS, str(rig.work / "go-4"))
    got = rig.backend.launch(job, (0,), job.spec.script)
    wait_until(lambda: running(rig, got, job) and rig.processes(job), limit=120)
    assert rig.backend.suspend(job.id, owner=rig.owner) is True
    wait_until(lambda: process_states(rig.processes(job)) == {"T"}, limit=120)
    assert rig.backend.suspend(job.id, owner=rig.owner) is True   # again: no change
    assert rig.state(got, job).state == RemoteState.RUNNING       # suspended is still there
    assert rig.backend.resume(job.id, owner=rig.owner) is True
    wait_until(lambda: "T" not in process_states(rig.processes(job)), limit=120)
    assert rig.backend.resume(job.id, owner=rig.owner) is True    # again: no change
    (rig.work / "go-4").touch()
    wait_until(lambda: rig.state(got, job).state == RemoteState.EXITED, limit=120)


def test_hold_and_release_act_only_where_the_backend_keeps_jobs_pending(rig):
    """With ``keeps_jobs_pending``: a job the backend's queue keeps waiting (its GPU is taken)
    is held there, idempotently, and released. Without: both do nothing and say so."""
    first, _ = rig.job(5, WAITS, str(rig.work / "go-5"), exclusive=True)
    got1 = rig.backend.launch(first, (0,), first.spec.script)
    wait_until(lambda: running(rig, got1, first), limit=120)
    if not rig.backend.keeps_jobs_pending:
        assert rig.backend.hold(first.id, owner=rig.owner) is False
        assert rig.backend.release(first.id, owner=rig.owner) is False
        assert rig.state(got1, first).state == RemoteState.RUNNING
        (rig.work / "go-5").touch()
        return
    second, _ = rig.job(6, WAITS, str(rig.work / "go-6"), exclusive=True)   # same GPU: waits
    got2 = rig.backend.launch(second, (0,), second.spec.script)
    waiting = wait_until(lambda: (s := rig.state(got2, second)).state == RemoteState.PENDING
                         and s, limit=60)
    assert not rig.backend.is_held(waiting)
    assert rig.backend.hold(second.id, owner=rig.owner) is True
    wait_until(lambda: rig.backend.is_held(rig.state(got2, second)), limit=120)
    assert rig.backend.hold(second.id, owner=rig.owner) is True   # again: already held
    assert rig.backend.release(second.id, owner=rig.owner) is True
    wait_until(lambda: not rig.backend.is_held(rig.state(got2, second)), limit=120)
    assert rig.backend.hold(first.id, owner=rig.owner) is False   # running: not pending
    (rig.work / "go-5").touch()
    wait_until(lambda: running(rig, got2, second), limit=120)      # released: it starts
    (rig.work / "go-6").touch()


def test_progress_is_readable_as_the_job_writes_it(rig):
    body = '#!/bin/sh\necho "1.5 10" >> "$IADEEP_PROGRESS_FILE"\necho wrote\n'
    job, _ = rig.job(7, body)
    assert rig.backend.read_progress(job, 0, 4096) is None   # none written yet
    got = rig.backend.launch(job, (0,), job.spec.script)
    wait_until(lambda: rig.state(got, job).state == RemoteState.EXITED, limit=120)
    assert rig.backend.read_progress(job, 0, 4096) == (b"1.5 10\n", 7)
    assert rig.backend.read_progress(job, 4, 4096) == (b"10\n", 7)
    with pytest.raises(InputError):
        rig.backend.read_log(job.id, -1, owner=rig.owner, job=job)


def test_set_aside_and_clean_keep_the_next_attempt_fresh(rig):
    """After set_aside the next attempt starts anew (never taken for the old one); clean
    removes what the backend kept of ended jobs, and both may be repeated."""
    job, _ = rig.job(8, '#!/bin/sh\necho "attempt $IADEEP_JOB_ID"\n')
    got = rig.backend.launch(job, (0,), job.spec.script)
    wait_until(lambda: rig.state(got, job).state == RemoteState.EXITED, limit=120)
    rig.backend.set_aside(job.id, "retry", owner=rig.owner)
    rig.backend.set_aside(job.id, "retry", owner=rig.owner)   # again: nothing left to move
    with pytest.raises(InputError):
        rig.backend.set_aside(job.id, "../x", owner=rig.owner)
    nxt = Job(job.id, job.owner, job.spec, JobState.STARTING, job.submitted_at, node=job.node,
              attempts=2)
    if rig.backend.job_dirs:
        assert rig.state(None, nxt).state == RemoteState.MISSING
    got2 = rig.backend.launch(nxt, (0,), job.spec.script)
    assert not got2.already_started
    wait_until(lambda: rig.state(got2, nxt).state == RemoteState.EXITED, limit=120)
    rig.backend.clean([job.id], owner=rig.owner)
    rig.backend.clean([job.id], owner=rig.owner)   # again: nothing left
    with pytest.raises(InputError):
        rig.backend.clean([-1], owner=rig.owner)
    if rig.backend.job_dirs:
        assert rig.state(None, nxt).state == RemoteState.MISSING

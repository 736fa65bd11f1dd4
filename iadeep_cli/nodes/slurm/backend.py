"""``SlurmBackend``: job control on a Slurm node (a ``nodes.backend.Backend``): each attempt is
one ``sbatch`` pinned to the node and GPU ``plan()`` chose, run as its owner; ``scancel``,
``scontrol`` and the job's files on the shared filesystem do the rest."""
from __future__ import annotations

import math
import os
import pwd
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from ... import jobopts
from ...errors import InputError, NodeError, NotFoundError
from ...jobs import SIGNALS, Job, checkpoint_signal_of
from ...settings import BackendKind, Inventory, Node, SlurmSettings
from ...snapshot import NodeSnapshot, RemoteJob
from ..backend import MAX_LOG_READ, LaunchResult, LogBytes, log_bytes
from ..gpu import Expect
from .commands import ENDED, Slurm, _tag_prefix, held_in_slurm, tag


class SlurmAccess(Protocol):
    """What the Slurm backend needs of its pool (``pool.SlurmPool`` is one)."""

    inventory: Inventory
    settings: SlurmSettings
    slurm: Slurm
    install_id: str

    def node(self, name: str) -> Node: ...

    def poll_slurm(self, nodes: Sequence[Node], expect: Mapping[str, Expect],
                   owners: Mapping[int, str] | None = None) -> tuple[NodeSnapshot, ...]: ...


class SlurmBackend:
    """``nodes.backend.Backend`` for one Slurm node: the functions below, for ``node``."""

    kind = BackendKind.SLURM
    keeps_jobs_pending = True   # sbatch queues it; Slurm may keep it pending (and held)
    progress_in_poll = False    # the progress file is on the controller's (shared) filesystem
    job_dirs = False            # each attempt has a Slurm job name of its own, no directory
    interactive = False         # no job directory for a --pty job's keystrokes (use srun)

    def __init__(self, pool: SlurmAccess, node: str):
        self.pool, self.node = pool, node

    def launch(self, job: Job, gpu_indices: Sequence[int], script: str | Path) -> LaunchResult:
        slurm_id, before = launch(self.pool, self.node, job, gpu_indices, Path(script))
        return LaunchResult(slurm_id, slurm_id, "", already_started=before, waiting=True)

    def cancel(self, job_id: int, grace_s: float = 10.0, owner: str | None = None) -> str:
        return cancel(self.pool, job_id)   # Slurm's own KillWait is the grace

    def signal(self, job_id: int, name: str, owner: str | None = None) -> bool:
        return signal(self.pool, job_id, name)

    def suspend(self, job_id: int, owner: str | None = None) -> bool:
        return pause(self.pool, job_id, True)

    def resume(self, job_id: int, owner: str | None = None) -> bool:
        return pause(self.pool, job_id, False)

    def hold(self, job_id: int, owner: str | None = None) -> bool:
        return hold(self.pool, job_id, True)

    def release(self, job_id: int, owner: str | None = None) -> bool:
        return hold(self.pool, job_id, False)

    def is_held(self, remote: RemoteJob) -> bool:
        return held_in_slurm(remote.reason)

    def states(self, expect: Sequence[int] | Expect, owner: str | None = None
               ) -> dict[int, RemoteJob]:
        if not expect:
            return {}
        want = [j if isinstance(j, tuple) else (int(j), None, None) for j in expect]
        snap = self.pool.poll_slurm([self.pool.node(self.node)], {self.node: tuple(want)},
                                    {int(j): owner for j, _, _ in want} if owner else None)[0]
        return dict(snap.jobs or ())

    def read_log(self, job_id: int, offset: int = 0, max_bytes: int = 65536,
                 owner: str | None = None, job: Job | None = None,
                 stream: str = "output") -> LogBytes:
        if offset < 0 or max_bytes <= 0:
            raise InputError(f"invalid log range offset={offset} max_bytes={max_bytes}",
                             hint="offset must be >= 0 and max_bytes > 0")
        if job is None:
            raise InputError(f"job {job_id} runs on Slurm node {self.node}: its log is read by "
                             "job")
        path = stream_path(job, stream)
        got = read_file(self.pool, self.node, job, path, offset, min(max_bytes, MAX_LOG_READ))
        return log_bytes(got, job_id, self.node, path, offset, stream)

    def write_input(self, job: Job, data: bytes) -> None:
        raise NodeError(f"node {self.node} runs its jobs through Slurm: iadeep has no terminal "
                        f"of job {job.id} there", hint="for a shell on a Slurm node use srun --pty")

    def read_progress(self, job: Job, offset: int, max_bytes: int
                      ) -> tuple[bytes, int] | None:
        return read_file(self.pool, self.node, job, progress_path(job), offset, max_bytes)

    def set_aside(self, job_id: int, suffix: str, owner: str | None = None) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", suffix):
            raise InputError(f"bad directory suffix {suffix!r}")
        # a Slurm job has no directory of iadeep's: each attempt has its own name

    def clean(self, job_ids: Sequence[int], owner: str | None = None) -> None:
        if any(isinstance(j, bool) or not isinstance(j, int) or j < 0 for j in job_ids):
            raise InputError(f"clean_finished: job ids must be integers >= 0, got "
                             f"{list(job_ids)}")
        # nothing of iadeep's on the node: Slurm writes only the job's own output files


# --------------------------------------------------------------------------- jobs
def run_dir(job: Job) -> str:
    """Where the job runs: --chdir, else where it was submitted (as sbatch: Slurm clusters
    share their home directories), else its owner's home."""
    return job.spec.workdir or job.spec.submit_dir or pwd.getpwnam(job.owner).pw_dir


def stream_path(job: Job, stream: str) -> str:
    """The job's --output/--error file (``jobopts.stream_path``; ``%j`` is iadeep's id), else
    ``iadeep-<id>.out`` in its working directory; ``~`` is the owner's home here."""
    base = run_dir(job)
    try:
        home = pwd.getpwnam(job.owner).pw_dir
    except KeyError:   # no such account here: a ``~`` name stays as written (never read)
        home = None
    return jobopts.stream_path(job, stream, f"{base.rstrip('/')}/iadeep-{job.id}.out", base,
                            home=home)


def progress_path(job: Job) -> str:
    """The file the job appends its progress lines to (``IADEEP_PROGRESS_FILE``), one per
    attempt, in its working directory, where the controller reads it as it reads the job's
    output (Slurm clusters share their home directories); created by the job, so only a job
    that reports progress leaves one."""
    return f"{run_dir(job).rstrip('/')}/iadeep-{job.id}.{job.attempts}.progress"


def gres(pool: SlurmAccess, job: Job, gpu_indices: Sequence[int]) -> str:
    """The GRES that pins the job where ``plan()`` put it: whole GPUs for jobs ``plan()`` never
    shares (exclusive, multi-GPU, no workload label to profile by: a job queued before every
    job got its program's label), else shards of one GPU,
    shards_per_gpu // max_jobs_per_gpu of them, so that as many jobs fit as placement puts
    there."""
    p = pool.settings.gpu_type_prefix
    if job.spec.exclusive or len(gpu_indices) != 1 or not job.spec.workload:
        return ",".join(f"gpu:{p}{int(i)}:1" for i in gpu_indices)
    node = pool.node(job.node or "")
    per_gpu = node.max_jobs_per_gpu or pool.inventory.policy.max_jobs_per_gpu
    return f"shard:{p}{int(gpu_indices[0])}:{max(1, pool.settings.shards_per_gpu // per_gpu)}"


def _batch_script(path: Path, job: Job) -> bytes:
    """The script as Slurm runs it: as submitted; one without ``#!`` is a shell script (as an
    SSH node's shell runs it), so ``#!/bin/sh`` is put in front."""
    data = path.read_bytes()
    if data.startswith(b"#!"):
        return data
    if b"\0" in data[:4096]:
        raise InputError(f"job {job.id}: {Path(job.spec.script).name} is a binary; Slurm runs "
                         "only scripts", hint="submit a script that runs it (#!/bin/sh ...)")
    return b"#!/bin/sh\n" + data


def find(pool: SlurmAccess, name: str, user: str) -> list[int]:
    """``user``'s Slurm job ids of that name, ended ones included (while squeue keeps them)."""
    out = pool.slurm.run(["squeue", "-h", "-a", "-t", "all", "-n", name, "-u", user, "-o",
                          "%i"])
    return sorted(int(x) for x in out.split() if x.isdigit())


def launch(pool: SlurmAccess, node: str, job: Job, gpu_indices: Sequence[int],
           script: Path) -> tuple[int, bool]:
    """(Slurm job id, already submitted before): ``sbatch`` the attempt as its owner, pinned to
    ``node`` and its GPU(s); an attempt Slurm already has (by name) is never submitted again."""
    name = tag(pool.install_id, job.id, job.attempts)
    found = find(pool, name, job.owner)
    if found:
        return found[0], True
    if not script.is_file():
        raise NotFoundError(f"job {job.id}: script {script} not found on the controller",
                            hint="submit the job again with an existing script")
    try:
        user = pwd.getpwnam(job.owner)
    except KeyError:
        raise InputError(f"job {job.id}: user {job.owner!r} has no account on the controller's "
                         "machine, so Slurm cannot run the job as them",
                         hint="use the same accounts (LDAP/NIS) on the Slurm submit host") \
            from None
    if user.pw_uid == 0:
        raise InputError(f"job {job.id}: iadeep never runs a job as root")
    # what a login gives (an account whose shell refuses `su -` still gets these), then the
    # job's --export and --env, then iadeep's own
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
           "SHELL": user.pw_shell, **dict((*job.spec.exported, *job.spec.env))}
    env.update({"IADEEP_JOB_ID": str(job.id), "IADEEP_JOB_NAME": job.name,
                "IADEEP_PROGRESS_FILE": progress_path(job),
                "IADEEP_RESTART_COUNT": str(max(0, job.attempts - 1))})   # as the shell's
    if (ck := checkpoint_signal_of(job.spec)) is not None:   # the hooks listen for it
        env["IADEEP_CHECKPOINT_SIGNAL"] = ck
    if job.array_id is not None:
        env.update({"IADEEP_ARRAY_JOB_ID": str(job.array_id),
                    "IADEEP_ARRAY_INDEX": str(job.array_index)})
    for key in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or key.startswith("SLURM_"):
            raise InputError(f"job {job.id}: environment variable name {key!r} is not valid",
                             hint="use letters, digits and _ (not starting with a digit)")
    argv = ["sbatch", "--parsable", f"--uid={user.pw_uid}", f"--gid={user.pw_gid}",
            # the login environment of the owner, under what sbatch is given (its own env:
            # only the job's variables), nothing of the controller's
            "--export=ALL", "--get-user-env", f"--partition={pool.settings.partition}",
            f"--nodelist={node}", f"--gres={gres(pool, job, gpu_indices)}",
            f"--job-name={name}", f"--comment=iadeep job {job.id} of {job.owner}",
            # iadeep decides retries (--retries, a new attempt through plan()): Slurm requeueing
            # the attempt by itself (a node failure, `scontrol requeue`) would run it again
            # under the same Slurm id while iadeep still counted it as running
            "--no-requeue",
            f"--chdir={run_dir(job)}", f"--output={stream_path(job, 'output')}"]
    if job.spec.error:
        argv.append(f"--error={stream_path(job, 'error')}")
    if job.spec.host_mem_mib:   # host RAM and CPUs as the job asked (Slurm enforces them)
        argv.append(f"--mem={job.spec.host_mem_mib}M")
    if job.spec.cpus_per_task:
        argv.append(f"--cpus-per-task={job.spec.cpus_per_task}")
    if pool.settings.account:
        argv.append(f"--account={pool.settings.account}")
    if job.spec.time_limit_s:   # iadeep stops it first (and says timeout); Slurm's is the backstop
        minutes = math.ceil((job.spec.time_limit_s + pool.inventory.kill_grace_s) / 60) + 1
        argv.append(f"--time={minutes}")
    import tempfile
    # The job's variables reach the job alone: sbatch reads them from a file (0600, the
    # controller's; NUL-separated, so any value) into the job's environment, never into its
    # own. sbatch runs as root with SLURM_CONF alone: a member's LD_PRELOAD, say, meets no
    # root process, and no value shows in an argv.
    with tempfile.NamedTemporaryFile(prefix=f"iadeep-{job.id}-", suffix=".sh") as batch, \
            tempfile.NamedTemporaryFile(prefix=f"iadeep-{job.id}-", suffix=".env") as exported:
        batch.write(_batch_script(script, job))   # read by sbatch (as root), sent to Slurm
        batch.flush()
        exported.write(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        exported.flush()
        out = pool.slurm.run([*argv, f"--export-file={exported.name}", batch.name,
                              *job.spec.args], bare=True)
    first = out.strip().split(";")[0]
    if not first.isdigit():
        raise NodeError(f"slurm: sbatch gave no job id ({out.strip()[:80]!r})")
    return int(first), False


def _attempts(pool: SlurmAccess, job_id: int) -> list[tuple[int, str, str]]:
    """(Slurm id, state, reason) of every Slurm job (any attempt) of iadeep job ``job_id`` that
    has not ended: what cancel, signal, suspend/resume and hold/release act on."""
    prefix = _tag_prefix(pool.install_id, job_id)
    out = pool.slurm.run(["squeue", "-h", "-a", "-o", "%i %j %T %r"])
    found = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[1].startswith(prefix) and parts[2] not in ENDED:
            found.append((int(parts[0]), parts[2], parts[3] if len(parts) > 3 else ""))
    return found


def cancel(pool: SlurmAccess, job_id: int) -> str:
    """``scancel`` every Slurm job of the iadeep job (Slurm sends TERM, then KILL after its
    KillWait); "terminated", or "missing" when none runs."""
    ids = [slurm_id for slurm_id, _, _ in _attempts(pool, job_id)]
    if not ids:
        return "missing"
    pool.slurm.run(["scancel", *map(str, ids)])
    return "terminated"


def signal(pool: SlurmAccess, job_id: int, name: str) -> bool:
    if name.removeprefix("B:") not in SIGNALS:
        raise InputError(f"cannot send signal {name[:20]!r}", hint=f"one of {', '.join(SIGNALS)}")
    ids = [slurm_id for slurm_id, _, _ in _attempts(pool, job_id)]
    whom = ["--batch"] if name.startswith("B:") else ["--full"]   # sbatch's --signal=B:
    if ids:
        pool.slurm.run(["scancel", *whom, f"--signal={name.removeprefix('B:')}",
                        *map(str, ids)])
    return bool(ids)


def pause(pool: SlurmAccess, job_id: int, stop: bool) -> bool:
    """Run-time adaptation's suspend (``stop``) or resume on Slurm: ``scontrol suspend`` /
    ``scontrol resume`` of the job's running (suspended) Slurm job, so Slurm itself stops
    and continues every process of it and knows it is suspended (root only: the controller
    submits as root). Idempotent like SIGSTOP/SIGCONT: a job already in the wanted state is
    left alone, so the controller may repeat either after a crash. True if the job was there.
    iadeep's state (``suspended``/``running``, steps/adaptation.py) stays the one that says
    what must be; this only carries it out."""
    attempts = _attempts(pool, job_id)
    todo = [str(i) for i, state, _ in attempts if state == ("RUNNING" if stop else "SUSPENDED")]
    if todo:
        pool.slurm.run(["scontrol", "suspend" if stop else "resume", ",".join(todo)])
    return bool(attempts)


def hold(pool: SlurmAccess, job_id: int, held: bool) -> bool:
    """``scontrol hold`` (``held``) or ``scontrol release`` the job's pending Slurm job, so that
    Slurm does what iadeep's state (``held`` or ``starting``) says; a job already as wanted, or
    no longer pending, is left alone (idempotent: the loop repeats it until the poll agrees).
    True if a pending Slurm job of it was there."""
    pending = [(i, reason) for i, state, reason in _attempts(pool, job_id)
               if state == "PENDING"]
    todo = [str(i) for i, reason in pending if held_in_slurm(reason) != held]
    if todo:
        pool.slurm.run(["scontrol", "hold" if held else "release", ",".join(todo)])
    return bool(pending)


def read_file(pool: SlurmAccess, node: str, job: Job, path: str, offset: int,
              max_bytes: int) -> tuple[bytes, int] | None:
    """(up to ``max_bytes`` of the job's output file from ``offset``, its size), None if there
    is none. The controller reads as root, so only a regular file its owner owns is read (Slurm
    creates it as the owner), checked on what is actually open (no symlink followed, a FIFO
    cannot block): a path a user names never shows them a file that is not theirs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NodeError(f"node {node}: cannot read {path}: {exc.strerror}",
                        hint="the job may have replaced its output file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NodeError(f"node {node}: {path} is not a regular file; not reading it",
                            hint="the job may have replaced its output file")
        if st.st_uid != pwd.getpwnam(job.owner).pw_uid:
            raise InputError(f"job {job.id}: {path} is not {job.owner}'s file; not shown",
                             hint="Slurm writes a job's output as its owner; was it replaced?")
        data = os.pread(fd, max(0, max_bytes), offset) if offset < st.st_size else b""
        return data, max(st.st_size, offset + len(data))
    finally:
        os.close(fd)

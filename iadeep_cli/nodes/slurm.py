"""Slurm as the execution backend: iadeep decides the node, the GPU and who shares it (``plan()``
as for SSH nodes); Slurm starts the job as its owner, enforces limits and keeps accounting.

Why a second backend and not a scheduler plug-in: nothing in Slurm decides whether two jobs
should share a GPU, and iadeep's interference model does. So the inventory's ``slurm:``
partition's nodes become inventory nodes (``backend: slurm``) found with ``sinfo --json``, and
a placement on GPU K becomes one ``sbatch`` pinned to that node and that GPU through typed GRES:
``--gres=gpu:gK:1`` for a GPU of its own (exclusive, multi-GPU or unprofiled jobs, which
``plan()`` never shares), else ``--gres=shard:gK:S`` with S = shards_per_gpu // max_jobs_per_gpu,
so that the jobs ``plan()`` puts together fit, and a whole-GPU job keeps off a shared GPU.

``SlurmPool`` is a ``connection.Pool``: it answers for the Slurm nodes itself (one ``sinfo``
and one ``squeue`` a round, whatever the number of nodes) and hands every other node to the
SSH ``NodePool`` inside it, so SSH nodes and a partition coexist. The launcher's functions
come here for a Slurm node (``launcher`` checks ``Node.backend``).

Exactly once: every attempt's Slurm job is named ``iadeep-<install>-<job>-<attempt>``. Before
``sbatch`` the launch looks that name up, and a poll of a job that has no Slurm id recorded
(the controller died between deciding and ``sbatch`` returning) finds it by that name; only
when Slurm has no job of that name is the job queued again. The Slurm job id is recorded as
the job's ``remote_pid`` (``iadeep queue show`` prints it).

Slurm jobs that are not iadeep's are foreign load: their GPUs' shares of memory count as used.
"""
from __future__ import annotations

import json
import logging
import math
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .. import jobs
from ..errors import InputError, NodeError, NotFoundError
from ..inventory import Inventory, Node, SlurmSettings
from ..jobs import SIGNALS, Job
from ..snapshot import ClusterSnapshot, GpuProcess, GpuSample, NodeSnapshot, RemoteJob
from .connection import NodeConnection
from .gpu import Expect

log = logging.getLogger("iadeep.slurm")
# squeue's states of a job that is over; every other state holds (or will hold) its GPU.
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"})
# squeue's states of a job Slurm has not started (yet, or again): iadeep's job stays `starting`.
WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                     "RESV_DEL_HOLD"})
# squeue's reasons for a job held (``scontrol hold``, by an admin or its user): Slurm will not
# start it until released.
HELD_REASONS = ("JobHeldAdmin", "JobHeldUser")


def held_in_slurm(reason: str | None) -> bool:
    """Whether a pending Slurm job's reason (squeue's, or iadeep's "pending: <reason>") says
    it is held."""
    return (reason or "").endswith(HELD_REASONS)


_GRES = re.compile(r"^(gpu|shard):([A-Za-z0-9_]+):(\d+)")
SLURM_TIMEOUT_S = 20.0


def tag(install_id: str, job_id: int, attempt: int) -> str:
    """The Slurm job name of one attempt: found again after a crash, never reused."""
    return f"{_tag_prefix(install_id, job_id)}{int(attempt)}"


def _tag_prefix(install_id: str, job_id: int) -> str:
    """What every attempt's name of one iadeep job starts with."""
    return f"iadeep-{install_id[:12]}-{int(job_id)}-"


class Slurm:
    """The Slurm commands, run on the controller's machine (a submit host; root, for --uid)."""

    def __init__(self, settings: SlurmSettings, timeout: float = SLURM_TIMEOUT_S):
        self.settings = settings
        self.timeout = timeout
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if settings.conf:
            self.env["SLURM_CONF"] = settings.conf
        elif os.environ.get("SLURM_CONF"):
            self.env["SLURM_CONF"] = os.environ["SLURM_CONF"]

    def run(self, argv: Sequence[str], stdin: bytes | None = None,
            env: Mapping[str, str] | None = None, bare: bool = False) -> str:
        """stdout of a Slurm command; NodeError (one line) when it fails or is missing.
        ``bare``: the command's environment is ``env`` and SLURM_CONF alone (sbatch hands its
        environment to the job, over the owner's login environment). Never a job's variables:
        the command runs as root (``launch`` gives sbatch those in a file)."""
        exe = shutil.which(argv[0], path=self.env["PATH"])
        if exe is None:
            raise NodeError(f"slurm: {argv[0]} not found on the controller's machine",
                            hint="install slurm-client (the controller must be a submit host)")
        try:
            p = subprocess.run([exe, *argv[1:]], input=stdin or b"", capture_output=True,
                               timeout=self.timeout,
                               env={**({k: v for k, v in self.env.items() if k != "PATH"}
                                       if bare else self.env), **(env or {})})
        except subprocess.TimeoutExpired:
            raise NodeError(f"slurm: {argv[0]} did not answer within {self.timeout:g} s",
                            hint="check slurmctld (`scontrol ping`)") from None
        if p.returncode != 0:
            err = p.stderr.decode("utf-8", "replace").strip().splitlines()
            raise NodeError(f"slurm: {argv[0]} failed (exit {p.returncode}): "
                            f"{err[-1] if err else ''}", hint="check slurmctld (`scontrol ping`)")
        return p.stdout.decode("utf-8", "replace")

    def json(self, argv: Sequence[str]) -> dict:
        try:
            return json.loads(self.run(argv))
        except ValueError:
            raise NodeError(f"slurm: {argv[0]} --json gave unreadable output",
                            hint="Slurm 21.08 or later is needed") from None


# --------------------------------------------------------------------------- nodes and GPUs
def gpu_types(gres: str, prefix: str) -> dict[str, dict[int, int]]:
    """``gpu:g0:1,shard:g0:4(S:0)`` -> {"gpu": {0: 1}, "shard": {0: 4}} for types
    ``<prefix><index>``; other GRES and untyped GPUs are not iadeep's to place."""
    out: dict[str, dict[int, int]] = {"gpu": {}, "shard": {}}
    for part in gres.split(","):
        m = _GRES.match(part.strip())
        if m and m.group(2).startswith(prefix) and m.group(2)[len(prefix):].isdigit():
            index = int(m.group(2)[len(prefix):])
            out[m.group(1)][index] = out[m.group(1)].get(index, 0) + int(m.group(3))
    return out


def discover(settings: SlurmSettings, slurm: Slurm | None = None) -> tuple[Node, ...]:
    """The partition's nodes as inventory nodes (``backend: slurm``), from ``sinfo --json``."""
    slurm = slurm or Slurm(settings)
    data = slurm.json(["sinfo", "--json"])
    nodes = []
    for n in data.get("nodes", []):
        if settings.partition not in (n.get("partitions") or ()):
            continue
        gpus = gpu_types(str(n.get("gres") or ""), settings.gpu_type_prefix)["gpu"]
        # shared_paths "/": a job runs where it was submitted, as sbatch's do (``run_dir``),
        # and `queue why` says so (``jobs.run_dir_note``)
        nodes.append(Node(name=str(n["name"]), host=str(n.get("hostname") or n["name"]),
                          gpus=tuple(sorted(gpus)), backend="slurm", shared_paths=("/",)))
    if not nodes:
        raise NodeError(f"slurm: partition {settings.partition!r} has no nodes",
                        hint="check `slurm.partition` in the inventory against `sinfo`")
    return tuple(nodes)


def with_slurm_nodes(inventory: Inventory) -> Inventory:
    """The inventory with its ``slurm:`` partition's nodes added (as they are in Slurm now). A
    partition node listed under ``nodes:`` too (same name) is a Slurm node (its jobs go
    through sbatch) that keeps its SSH entry for telemetry (``Node.ssh_telemetry``: nvidia-smi
    over SSH, as for an SSH node); its ``gpus:`` there, if any, limit what iadeep uses."""
    if inventory.slurm is None:
        return inventory
    found = {n.name: n for n in discover(inventory.slurm)}
    nodes = tuple(replace(n, backend="slurm", ssh_telemetry=True,
                          gpus=found[n.name].gpus if n.gpus is None else
                          tuple(i for i in n.gpus if i in (found[n.name].gpus or ())),
                          shared_paths=found[n.name].shared_paths)
                  if n.name in found else n for n in inventory.nodes)
    listed = {n.name for n in inventory.nodes}
    return replace(inventory, nodes=nodes + tuple(n for name, n in found.items()
                                                  if name not in listed))


def _gres_detail(job: dict, prefix: str) -> dict[int, tuple[str, int]]:
    """GPU index -> ("gpu" or "shard", count) that a running Slurm job holds."""
    out: dict[int, tuple[str, int]] = {}
    for part in job.get("gres_detail") or ():
        m = _GRES.match(str(part))
        if m and m.group(2).startswith(prefix) and m.group(2)[len(prefix):].isdigit():
            out[int(m.group(2)[len(prefix):])] = (m.group(1), int(m.group(3)))
    return out


def _exit_code(job: dict) -> int | None:
    """The batch script's exit code; None when Slurm ended it (cancelled, timed out, node
    failed: killed, like a job without an exit file on an SSH node)."""
    state = str(job.get("job_state") or "")
    if state not in ("COMPLETED", "FAILED"):
        return None
    code = job.get("exit_code")
    if isinstance(code, dict):   # newer Slurm: {"return_code": N, "signal": {...}, ...}
        code = code.get("return_code")
        return int(code) if isinstance(code, int) else None
    if not isinstance(code, int):
        return None
    # 22.05: the wait status; a signal is reported as a shell does (128 + its number)
    return 128 + (code & 0x7F) if code & 0x7F else (code >> 8) & 0xFF


@dataclass(frozen=True)
class SlurmJob:
    id: int
    name: str
    state: str
    node: str
    user: str
    gres: dict[int, tuple[str, int]]
    exit_code: int | None
    reason: str = ""   # why Slurm keeps it pending (squeue's state_reason), "None" otherwise


def queue(slurm: Slurm) -> list[SlurmJob]:
    """Every job ``squeue`` knows (ended ones for MinJobAge, 300 s by default)."""
    out = []
    for j in slurm.json(["squeue", "--json"]).get("jobs", []):
        out.append(SlurmJob(int(j["job_id"]), str(j.get("name") or ""),
                            str(j.get("job_state") or ""), str(j.get("nodes") or ""),
                            str(j.get("user_name") or ""),
                            _gres_detail(j, slurm.settings.gpu_type_prefix), _exit_code(j),
                            str(j.get("state_reason") or "")))
    return out


# --------------------------------------------------------------------------- the pool
class SlurmPool:
    """A ``connection.Pool`` over the inventory's Slurm nodes and, inside it, its SSH nodes.

    ``attempts``: job ids -> their current attempt number (the controller reads it from its
    store), to find a job's Slurm job by name when its id was never recorded."""

    def __init__(self, inventory: Inventory, inner, install_id: str,
                 attempts: Callable[[Iterable[int]], Mapping[int, int]],
                 command_timeout: float = 20.0):
        assert inventory.slurm is not None
        self.inventory, self.inner, self.install_id = inventory, inner, install_id
        self.settings: SlurmSettings = inventory.slurm
        self.slurm = Slurm(self.settings)
        self.attempts = attempts
        self.command_timeout = command_timeout
        self._local: dict[str, NodeConnection] = {}

    def is_slurm(self, name: str) -> bool:
        node = self.inventory.node(name)
        return node is not None and node.backend == "slurm"

    def node(self, name: str) -> Node:
        return self.inventory.require_node(name)

    def connection(self, name: str) -> NodeConnection:
        if not self.is_slurm(name):
            return self.inner.connection(name)
        from .local import LocalConnection
        if name not in self._local:   # the controller's machine: Slurm's shared filesystem
            self._local[name] = LocalConnection(self.node(name), self.command_timeout)
        return self._local[name]

    def run(self, node_name: str, cmd, timeout: float | None = None,
            stdin: bytes | None = None) -> tuple[int, str, str]:
        return self.connection(node_name).run(cmd, timeout=timeout, stdin=stdin)

    def poll_all(self, expect: Mapping[str, Expect] | None = None, wait_s: float | None = None,
                 owners: Mapping[int, str] | None = None,
                 progress: Mapping[int, int] | None = None) -> ClusterSnapshot:
        expect = expect or {}
        ssh = [n.name for n in self.inventory.nodes if n.backend != "slurm"]
        # the SSH nodes and the Slurm nodes read over SSH for telemetry (no jobs expected
        # there: Slurm answers for their jobs), in the same parallel round
        telemetry = {n.name for n in self.inventory.nodes if n.ssh_telemetry}
        inner = self.inner.poll_all({k: v for k, v in expect.items() if k in ssh}, wait_s,
                                    owners, progress) if ssh or telemetry else None
        mine = [n for n in self.inventory.nodes if n.backend == "slurm"]
        polled = self.poll_slurm(mine, {n.name: tuple(expect.get(n.name, ())) for n in mine},
                                 owners)
        seen = {s.name: s for s in (inner.nodes if inner else ()) if s.name in telemetry}
        polled = tuple(with_telemetry(p, seen.get(p.name)) for p in polled)
        nodes = (*(s for s in (inner.nodes if inner else ()) if s.name not in telemetry),
                 *polled)
        return ClusterSnapshot(taken_at=inner.taken_at if inner else polled[0].taken_at
                               if polled else time.time(), nodes=nodes)

    def poll_slurm(self, nodes: Sequence[Node], expect: Mapping[str, Expect],
                   owners: Mapping[int, str] | None = None) -> tuple[NodeSnapshot, ...]:
        """Every Slurm node's GPUs (held by whom) and expected jobs, from one sinfo and one
        squeue; a failing Slurm is every Slurm node's silence (its jobs are not lost before
        ``node_grace``). A job found by name counts only if it runs as the job's owner
        (``owners``): anyone may name a Slurm job like iadeep's, only root submits as another."""
        start, t0 = time.time(), time.monotonic()
        try:
            info = {str(n["name"]): n for n in self.slurm.json(["sinfo", "--json"])
                    .get("nodes", [])}
            sq = queue(self.slurm)
        except NodeError as exc:
            return tuple(NodeSnapshot(n.name, start, error=exc.message) for n in nodes)
        rtt = time.monotonic() - t0
        # the attempt (hence the name) is looked up only for a job whose Slurm id was not
        # recorded: a crash between sbatch and its commit
        ids = {int(j) for e in expect.values() for j, slurm_id, _ in e if not slurm_id}
        attempt = dict(self.attempts(ids)) if ids else {}
        by_id = {j.id: j for j in sq}
        by_name = {j.name: j for j in sorted(sq, key=lambda j: j.id)}
        # iadeep's own Slurm jobs: Slurm id -> iadeep job id (the name's third field)
        ours = {j.id: int(j.name.split("-")[2]) for j in sq
                if re.fullmatch(rf"iadeep-{re.escape(self.install_id[:12])}-\d+-\d+", j.name)}
        on_node: dict[str, list[SlurmJob]] = {}
        for j in sq:
            if j.state not in ENDED:
                on_node.setdefault(j.node, []).append(j)
        out = []
        for node in nodes:
            n = info.get(node.name)
            if n is None:
                out.append(NodeSnapshot(node.name, start, error="not in Slurm any more"))
                continue
            states: list[tuple[int, RemoteJob]] = []
            for job_id, slurm_id, _ in expect.get(node.name, ()):
                sj = by_id.get(slurm_id) if slurm_id else by_name.get(
                    tag(self.install_id, job_id, attempt.get(int(job_id), 0)))
                owner = (owners or {}).get(int(job_id))
                if sj is not None and not slurm_id and owner and sj.user != owner:
                    sj = None
                if sj is None:   # never submitted, or ended past MinJobAge: exit code lost
                    states.append((int(job_id), RemoteJob("missing") if not slurm_id
                                   else RemoteJob("exited")))
                elif sj.state in ENDED:
                    states.append((int(job_id), RemoteJob("exited", sj.exit_code, sj.id)))
                elif sj.state in WAITING:
                    why = sj.state.lower() + (f": {sj.reason}" if sj.reason not in
                                              ("", "None") else "")
                    states.append((int(job_id), RemoteJob("pending", pid=sj.id, reason=why)))
                else:
                    states.append((int(job_id), RemoteJob("running", pid=sj.id)))
            error = self._node_error(n)
            gpus = () if error else self._gpus(node, n, on_node.get(node.name, []), ours)
            out.append(NodeSnapshot(node.name, start, gpus=gpus, error=error, rtt_s=rtt,
                                    jobs=tuple(states)))
        return tuple(out)

    @staticmethod
    def _node_error(n: dict) -> str | None:
        state = str(n.get("state") or "").lower()
        flags = {str(f).upper() for f in n.get("state_flags") or ()}
        if state in ("down", "drained", "fail", "future", "unknown") or \
                flags & {"DRAIN", "DRAINING", "NOT_RESPONDING", "FAIL", "MAINTENANCE"}:
            return f"slurm node state {state}{'+' + '+'.join(sorted(flags)) if flags else ''}"
        return None

    def _gpus(self, node: Node, n: dict, running: list[SlurmJob], ours: dict[int, int]
              ) -> tuple[GpuSample, ...]:
        """The node's GPUs as Slurm holds them: iadeep's jobs (``ours``: Slurm id -> iadeep
        job id) as processes with their job id (so placement counts them), others' as foreign
        processes using their share of the GPU's memory (a whole GPU: all of it)."""
        shards = gpu_types(str(n.get("gres") or ""), self.settings.gpu_type_prefix)["shard"]
        total = self.settings.gpu_memory_gib * 1024.0
        gpus = []
        for index in node.gpus or ():
            procs, used = [], 0.0
            for j in running:
                held = j.gres.get(index)
                if held is None:
                    continue
                kind, count = held
                if j.id in ours:
                    procs.append(GpuProcess(j.id, None, f"slurm job {j.id}", job_id=ours[j.id]))
                    continue
                share = total if kind == "gpu" else total * count / max(1, shards.get(index, 1))
                used += share
                procs.append(GpuProcess(j.id, share, f"slurm job {j.id} ({j.user})"))
            gpus.append(GpuSample(index, f"slurm-{node.name}-{self.settings.gpu_type_prefix}"
                                  f"{index}", f"slurm gres {self.settings.gpu_type_prefix}"
                                  f"{index}", memory_total_mib=total, memory_used_mib=used,
                                  memory_free_mib=max(0.0, total - used),
                                  processes=tuple(procs)))
        return tuple(gpus)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def with_telemetry(slurm_snap: NodeSnapshot, ssh_snap: NodeSnapshot | None) -> NodeSnapshot:
    """A Slurm node's snapshot with its GPUs' telemetry from an SSH poll of the same node
    (nvidia-smi: real memory, utilisation, temperature, power and the processes on each GPU),
    so placement sees foreign memory use as on an SSH node. What Slurm holds stays: iadeep's
    Slurm jobs are processes with their job id (placement counts them), and a foreign Slurm
    job's reservation counts as used even before its processes use the memory (Slurm would
    keep a job placed there pending). GPU K of the GRES is nvidia-smi's index K (gres.conf's
    ``File=/dev/nvidiaK``). Without a usable SSH answer (down, nvidia-smi failing) the
    Slurm-only figures stay: the jobs' states never depend on SSH."""
    if ssh_snap is None or not ssh_snap.ok or slurm_snap.error or not ssh_snap.gpus:
        return slurm_snap
    smi = {g.index: g for g in ssh_snap.gpus}
    gpus = []
    for g in slurm_snap.gpus:
        real = smi.get(g.index)
        if real is None:
            gpus.append(g)
            continue
        # Slurm's reservation by foreign Slurm jobs (the Slurm-only "used" figure, scaled to
        # the real GPU's size), never less than what nvidia-smi shows in use
        reserved = ((g.memory_used_mib or 0.0) / g.memory_total_mib * real.memory_total_mib
                    if g.memory_total_mib and real.memory_total_mib else 0.0)
        used = max(real.memory_used_mib or 0.0, reserved)
        total = real.memory_total_mib
        procs = (*real.processes,
                 *(p if p.job_id is not None or not p.used_memory_mib or not g.memory_total_mib
                   or not total else replace(p, used_memory_mib=p.used_memory_mib /
                                             g.memory_total_mib * total)
                   for p in g.processes))
        gpus.append(replace(real, memory_used_mib=used,
                            memory_free_mib=max(0.0, total - used) if total is not None
                            else real.memory_free_mib, processes=tuple(procs)))
    return replace(slurm_snap, gpus=tuple(gpus))


# --------------------------------------------------------------------------- jobs
def run_dir(job: Job) -> str:
    """Where the job runs: --chdir, else where it was submitted (as sbatch: Slurm clusters
    share their home directories), else its owner's home."""
    return job.spec.workdir or job.spec.submit_dir or pwd.getpwnam(job.owner).pw_dir


def stream_path(job: Job, stream: str) -> str:
    """The job's --output/--error file (``jobs.stream_path``; ``%j`` is iadeep's id), else
    ``iadeep-<id>.out`` in its working directory; ``~`` is the owner's home here."""
    base = run_dir(job)
    try:
        home = pwd.getpwnam(job.owner).pw_dir
    except KeyError:   # no such account here: a ``~`` name stays as written (never read)
        home = None
    return jobs.stream_path(job, stream, f"{base.rstrip('/')}/iadeep-{job.id}.out", base,
                            home=home)


def progress_path(job: Job) -> str:
    """The file the job appends its progress lines to (``IADEEP_PROGRESS_FILE``), one per
    attempt, in its working directory, where the controller reads it as it reads the job's
    output (Slurm clusters share their home directories); created by the job, so only a job
    that reports progress leaves one."""
    return f"{run_dir(job).rstrip('/')}/iadeep-{job.id}.{job.attempts}.progress"


def gres(pool: SlurmPool, job: Job, gpu_indices: Sequence[int]) -> str:
    """The GRES that pins the job where ``plan()`` put it: whole GPUs for jobs ``plan()`` never
    shares (exclusive, multi-GPU, no workload label to profile by), else shards of one GPU,
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


def find(pool: SlurmPool, name: str, user: str) -> list[int]:
    """``user``'s Slurm job ids of that name, ended ones included (while squeue keeps them)."""
    out = pool.slurm.run(["squeue", "-h", "-a", "-t", "all", "-n", name, "-u", user, "-o",
                          "%i"])
    return sorted(int(x) for x in out.split() if x.isdigit())


def launch(pool: SlurmPool, node: str, job: Job, gpu_indices: Sequence[int],
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
                "IADEEP_PROGRESS_FILE": progress_path(job)})
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


def _attempts(pool: SlurmPool, job_id: int) -> list[tuple[int, str, str]]:
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


def cancel(pool: SlurmPool, job_id: int) -> str:
    """``scancel`` every Slurm job of the iadeep job (Slurm sends TERM, then KILL after its
    KillWait); "terminated", or "missing" when none runs."""
    ids = [slurm_id for slurm_id, _, _ in _attempts(pool, job_id)]
    if not ids:
        return "missing"
    pool.slurm.run(["scancel", *map(str, ids)])
    return "terminated"


def signal(pool: SlurmPool, job_id: int, name: str) -> bool:
    if name not in SIGNALS:
        raise InputError(f"cannot send signal {name[:20]!r}", hint=f"one of {', '.join(SIGNALS)}")
    ids = [slurm_id for slurm_id, _, _ in _attempts(pool, job_id)]
    if ids:
        pool.slurm.run(["scancel", "--full", f"--signal={name}", *map(str, ids)])
    return bool(ids)


def pause(pool: SlurmPool, job_id: int, stop: bool) -> bool:
    """Run-time adaptation's suspend (``stop``) or resume on Slurm: ``scontrol suspend`` /
    ``scontrol resume`` of the job's running (suspended) Slurm job, so Slurm itself stops
    and continues every process of it and knows it is suspended (root only: the controller
    submits as root). Idempotent like SIGSTOP/SIGCONT: a job already in the wanted state is
    left alone, so the controller may repeat either after a crash. True if the job was there.
    iadeep's state (``suspended``/``running``, controller/adapt.py) stays the one that says
    what must be; this only carries it out."""
    attempts = _attempts(pool, job_id)
    todo = [str(i) for i, state, _ in attempts if state == ("RUNNING" if stop else "SUSPENDED")]
    if todo:
        pool.slurm.run(["scontrol", "suspend" if stop else "resume", ",".join(todo)])
    return bool(attempts)


def hold(pool: SlurmPool, job_id: int, held: bool) -> bool:
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


def read_file(pool: SlurmPool, node: str, job: Job, path: str, offset: int,
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

"""``SlurmPool``: a ``connection.Pool`` over the inventory's Slurm nodes (one ``sinfo`` and one
``squeue`` a round, whatever the number of nodes) and, inside it, the SSH ``NodePool`` that
answers for every other node; and the partition's nodes as inventory nodes (``discover``)."""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ...errors import NodeError
from ...settings import BackendKind, Inventory, Node, SlurmSettings
from ...snapshot import ClusterSnapshot, GpuProcess, GpuSample, NodeSnapshot, RemoteJob, RemoteState
from ..backend import Backend
from ..connection import NodeConnection, Pool
from ..gpu import Expect
from .backend import SlurmBackend
from .commands import ENDED, WAITING, Slurm, SlurmJob, gpu_types, queue, tag


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
        # and `queue why` says so (``jobopts.run_dir_note``)
        nodes.append(Node(name=str(n["name"]), host=str(n.get("hostname") or n["name"]),
                          gpus=tuple(sorted(gpus)), backend=BackendKind.SLURM, shared_paths=("/",)))
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
    nodes = tuple(replace(n, backend=BackendKind.SLURM, ssh_telemetry=True,
                          gpus=found[n.name].gpus if n.gpus is None else
                          tuple(i for i in n.gpus if i in (found[n.name].gpus or ())),
                          shared_paths=found[n.name].shared_paths)
                  if n.name in found else n for n in inventory.nodes)
    listed = {n.name for n in inventory.nodes}
    return replace(inventory, nodes=nodes + tuple(n for name, n in found.items()
                                                  if name not in listed))


# --------------------------------------------------------------------------- the pool
class SlurmPool:
    """A ``connection.Pool`` over the inventory's Slurm nodes and, inside it, its SSH nodes.

    ``attempts``: job ids -> their current attempt number (the controller reads it from its
    store), to find a job's Slurm job by name when its id was never recorded."""

    def __init__(self, inventory: Inventory, inner: Pool, install_id: str,
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
        return node is not None and node.backend == BackendKind.SLURM

    def node(self, name: str) -> Node:
        return self.inventory.require_node(name)

    def connection(self, name: str) -> NodeConnection:
        if not self.is_slurm(name):
            return self.inner.connection(name)
        from ..local import LocalConnection
        if name not in self._local:   # the controller's machine: Slurm's shared filesystem
            self._local[name] = LocalConnection(self.node(name), self.command_timeout)
        return self._local[name]

    def backend(self, name: str) -> Backend:
        """A Slurm node's ``SlurmBackend``; any other node's is the shell's, over this pool
        (its connections are the inner pool's)."""
        if self.is_slurm(name):
            return SlurmBackend(self, name)
        from ..shell import ShellBackend
        return ShellBackend(self, name)

    def run(self, node_name: str, cmd: str | Sequence[str], timeout: float | None = None,
            stdin: bytes | None = None) -> tuple[int, str, str]:
        return self.connection(node_name).run(cmd, timeout=timeout, stdin=stdin)

    def poll_all(self, expect: Mapping[str, Expect] | None = None, wait_s: float | None = None,
                 owners: Mapping[int, str] | None = None,
                 progress: Mapping[int, int] | None = None) -> ClusterSnapshot:
        expect = expect or {}
        ssh = [n.name for n in self.inventory.nodes if n.backend != BackendKind.SLURM]
        # the SSH nodes and the Slurm nodes read over SSH for telemetry (no jobs expected
        # there: Slurm answers for their jobs), in the same parallel round
        telemetry = {n.name for n in self.inventory.nodes if n.ssh_telemetry}
        inner = self.inner.poll_all({k: v for k, v in expect.items() if k in ssh}, wait_s,
                                    owners, progress) if ssh or telemetry else None
        mine = [n for n in self.inventory.nodes if n.backend == BackendKind.SLURM]
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
                    states.append((int(job_id), RemoteJob(RemoteState.MISSING) if not slurm_id
                                   else RemoteJob(RemoteState.EXITED)))
                elif sj.state in ENDED:
                    states.append((int(job_id),
                                   RemoteJob(RemoteState.EXITED, sj.exit_code, sj.id)))
                elif sj.state in WAITING:
                    why = sj.state.lower() + (f": {sj.reason}" if sj.reason not in
                                              ("", "None") else "")
                    states.append((int(job_id),
                                   RemoteJob(RemoteState.PENDING, pid=sj.id, reason=why)))
                else:
                    states.append((int(job_id), RemoteJob(RemoteState.RUNNING, pid=sj.id)))
            error = self._node_error(n)
            gpus = () if error else self._gpus(node, n, on_node.get(node.name, []), ours)
            out.append(NodeSnapshot(node.name, start, gpus=gpus, error=error, rtt_s=rtt,
                                    jobs=tuple(states)))
        return tuple(out)

    @staticmethod
    def _node_error(n: dict[str, Any]) -> str | None:
        state = str(n.get("state") or "").lower()
        flags = {str(f).upper() for f in n.get("state_flags") or ()}
        if state in ("down", "drained", "fail", "future", "unknown") or \
                flags & {"DRAIN", "DRAINING", "NOT_RESPONDING", "FAIL", "MAINTENANCE"}:
            return f"slurm node state {state}{'+' + '+'.join(sorted(flags)) if flags else ''}"
        return None

    def _gpus(self, node: Node, n: dict[str, Any], running: list[SlurmJob], ours: dict[int, int]
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

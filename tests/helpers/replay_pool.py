"""A node pool for driving ``SchedulingLoop`` in process, with what the nodes say scripted.

``ReplayPool`` is a ``nodes.connection.Pool``. Each node has a mode the test sets between
rounds: ``up`` (answers; its GPUs are the ones the test gave), ``gpu_failing`` (answers, but
its GPU query fails) or ``silent`` (does not answer at all). Everything else is real: commands,
uploads and reads run on this machine through a ``LocalConnection`` in the node's own
temporary workdir, so a launch starts a real detached process, a cancel signals it, and the
state of every job a poll is asked about (and its new progress) is read from its real pid, exit
and progress files by the state script every poll runs (``nodes.shell.jobstate.state_script``).
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from iadeep_cli.errors import IadeepError, NotFoundError
from iadeep_cli.nodes.backend import Backend
from iadeep_cli.nodes.connection import NodeConnection
from iadeep_cli.nodes.gpu import Expect, split_sections
from iadeep_cli.nodes.local import LocalConnection
from iadeep_cli.nodes.shell import ShellBackend
from iadeep_cli.nodes.shell.jobstate import parse_progress, parse_states, state_script
from iadeep_cli.settings import Inventory, Node
from iadeep_cli.snapshot import ClusterSnapshot, GpuSample, NodeSnapshot

H200_MIB = 143771.0
MODES = ("up", "gpu_failing", "silent")


def idle_gpus(count: int) -> tuple[GpuSample, ...]:
    """``count`` idle H200s as nvidia-smi reports them."""
    return tuple(GpuSample(index=i, uuid=f"GPU-{i}", name="NVIDIA H200",
                           memory_total_mib=H200_MIB, memory_used_mib=0.0,
                           memory_free_mib=H200_MIB, utilization_gpu=0.0) for i in range(count))


class ReplayPool:
    def __init__(self, inventory: Inventory, gpus: Mapping[str, int]):
        self.inventory = inventory
        self.command_timeout = 20.0
        self._conns = {n.name: LocalConnection(n, self.command_timeout) for n in inventory.nodes}
        self.gpus = {name: idle_gpus(n) for name, n in gpus.items()}
        self.modes = {n.name: "up" for n in inventory.nodes}

    def set_mode(self, node: str, mode: str) -> None:
        assert mode in MODES, mode
        self.modes[node] = mode

    # -- NodeAccess
    def node(self, name: str) -> Node:
        node = self.inventory.node(name)
        if node is None:
            raise NotFoundError(f"no node named {name!r} in the inventory")
        return node

    def connection(self, name: str) -> NodeConnection:
        self.node(name)
        return self._conns[name]

    def run(self, node_name: str, cmd: str | Sequence[str], timeout: float | None = None,
            stdin: bytes | None = None) -> tuple[int, str, str]:
        return self.connection(node_name).run(cmd, timeout=timeout, stdin=stdin)

    # -- Pool
    def backend(self, name: str) -> Backend:
        return ShellBackend(self, name)   # the real shell backend, on this machine

    def poll_all(self, expect: Mapping[str, Expect] | None = None,
                 wait_s: float | None = None,
                 owners: Mapping[int, str] | None = None,
                 progress: Mapping[int, int] | None = None) -> ClusterSnapshot:
        taken = time.time()   # wall clock, like NodePool: the loop compares it with its actions
        nodes = []
        for node in self.inventory.nodes:
            mode = self.modes[node.name]
            if mode == "silent":
                nodes.append(NodeSnapshot(node.name, taken, error="no answer (scripted)"))
                continue
            here = {int(j) for j, _, _ in (expect or {}).get(node.name, ())}
            asked = tuple(sorted(j for j in progress or {} if j in here))
            try:
                jobs, read = self._job_states(node, (expect or {}).get(node.name, ()),
                                              progress or {})
            except IadeepError as exc:   # as NodePool.poll: the node's error, not a crash
                nodes.append(NodeSnapshot(node.name, taken, error=exc.message))
                continue
            if mode == "gpu_failing":
                nodes.append(NodeSnapshot(node.name, taken, error="nvidia-smi failed (scripted)",
                                          jobs=jobs, progress=read, progress_asked=asked))
            else:
                nodes.append(NodeSnapshot(node.name, taken, gpus=self.gpus[node.name],
                                          jobs=jobs, progress=read, progress_asked=asked))
        return ClusterSnapshot(taken, tuple(nodes))

    def _job_states(self, node: Node, expect: Expect, progress: Mapping[int, int]):
        ids = {int(j) for j, _, _ in expect}
        script = state_script(node.workdir, expect, {j: o for j, o in progress.items()
                                                     if j in ids})
        _, out, _ = self.run(node.name, ["sh", "-c", script])
        sec = split_sections(out)
        return parse_states(sec.get("state", (None, ""))[1]), parse_progress(sec)

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()

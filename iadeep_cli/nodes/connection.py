"""The seams between the controller and its nodes, named as Protocols.

``NodeConnection`` is what one node's connection does: ``SshConnection`` (paramiko) and
``LocalConnection`` (the controller's own machine, no SSH) both are one, so the shell backend's
code is the same everywhere. ``NodeAccess`` is what the shell backend needs of a pool of nodes;
``Pool`` adds what the scheduling loop needs: every node polled at once, and each node's
``Backend``. ``NodePool`` is the real pool (``SlurmPool`` wraps it when the inventory has a
Slurm partition); the loop's in-process tests drive it with a pool that replays snapshots.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..settings import Node
from ..snapshot import ClusterSnapshot
from .backend import Backend
from .gpu import Expect


class NodeConnection(Protocol):
    def run(self, command: str | Sequence[str], timeout: float | None = None,
            stdin: bytes | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of a command (a string goes to the shell as given, a
        list is quoted with ``as_command``); NodeError when the node cannot run it."""

    def put(self, local: str | os.PathLike[str], remote: str, mode: int = 0o700) -> None:
        """Copy a local file to the node and set its mode."""

    def read(self, remote: str, offset: int, max_bytes: int) -> tuple[bytes, int] | None:
        """(up to ``max_bytes`` of a node's regular file from ``offset``, the file's size);
        None if it does not exist.  A FIFO, device or directory there is a NodeError."""

    def close(self) -> None: ...


class NodeAccess(Protocol):
    """Nodes by name: their inventory entry, their connection, a command on them."""

    command_timeout: float

    def node(self, name: str) -> Node:
        """The inventory's node; NotFoundError for a name the inventory does not list."""

    def connection(self, name: str) -> NodeConnection: ...

    def run(self, node_name: str, cmd: str | Sequence[str], timeout: float | None = None,
            stdin: bytes | None = None) -> tuple[int, str, str]: ...


class Pool(NodeAccess, Protocol):
    def backend(self, name: str) -> Backend:
        """Job control on node ``name`` (``nodes.backend``): the implementation its
        ``Node.backend`` names; NotFoundError for a name the inventory does not list."""

    def poll_all(self, expect: Mapping[str, Expect] | None = None,
                 wait_s: float | None = None,
                 owners: Mapping[int, str] | None = None,
                 progress: Mapping[int, int] | None = None) -> ClusterSnapshot:
        """Every node's GPUs and the state of the jobs ``expect``ed there (``owners``: job id
        -> owner, for ``run_as: submitter`` nodes), waiting at most ``wait_s``; a node that
        did not answer is a ``NodeSnapshot`` with ``error`` set.  ``progress`` (job id ->
        offset): running jobs whose new progress bytes the same poll reads
        (``NodeSnapshot.progress``)."""

    def close(self) -> None: ...


def as_command(cmd: str | Sequence[str]) -> str:
    """An argv list becomes a safely quoted command line; a string is used as given."""
    return cmd if isinstance(cmd, str) else " ".join(shlex.quote(str(a)) for a in cmd)


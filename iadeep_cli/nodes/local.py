"""The controller's own machine as a node: a ``NodeConnection`` like ``SshConnection``, no SSH.

The shell backend and ``NodePool.run`` talk to a ``NodeConnection`` (``run``/``put``/``read``/
``close``); for ``Node.local`` that is a subprocess running ``sh -c`` and plain file copies, so
a one-machine lab needs no sshd and the shell backend's code is the same everywhere.  Like an
SSH session, commands start in the home directory, so a relative ``workdir`` means the same on
every node (not "relative to wherever the controller was started").
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence

from ..errors import NodeError
from ..settings import Node
from .connection import as_command
from .ssh import regular_size


def on_node(path: str) -> str:
    """A path as an SSH session on this machine would see it: ``~`` expanded, relative to home."""
    return os.path.join(os.path.expanduser("~"), os.path.expanduser(path))


def _home() -> str | None:
    home = on_node("~")
    return home if os.path.isdir(home) else None   # no home: sshd would start in / too


def run_bounded(argv: Sequence[str], timeout: float, stdin: bytes | None = None,
                cwd: str | None = None) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of ``argv`` in a session of its own; after ``timeout`` it is
    killed with every process it started (its process group), and TimeoutExpired raised: a
    reader left blocked (on a FIFO) never outlives its command."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=cwd, start_new_session=True)
    try:
        out, err = p.communicate(stdin or b"", timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            p.communicate(timeout=5)
        except subprocess.TimeoutExpired:   # something escaped the group holds the pipes
            pass
        raise
    return p.returncode, out, err


class LocalConnection:
    def __init__(self, node: Node, command_timeout: float = 20.0):
        self.node = node
        self.command_timeout = command_timeout
        self.connected = True

    def run(self, command: str | Sequence[str], timeout: float | None = None,
            stdin: bytes | None = None) -> tuple[int, str, str]:
        timeout = self.command_timeout if timeout is None else timeout
        try:
            rc, out, err = run_bounded(["sh", "-c", as_command(command)], timeout, stdin,
                                       _home())
        except subprocess.TimeoutExpired:
            raise NodeError(f"node {self.node.name}: command did not finish within {timeout:g} s",
                            hint="raise command_timeout if it is just slow") from None
        return rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def put(self, local: str | os.PathLike[str], remote: str, mode: int = 0o700) -> None:
        try:
            shutil.copyfile(local, on_node(remote))
            os.chmod(on_node(remote), mode)
        except OSError as exc:
            raise NodeError(f"node {self.node.name}: cannot copy {local} to {remote}: "
                            f"{exc.strerror}") from None

    def read(self, remote: str, offset: int, max_bytes: int) -> tuple[bytes, int] | None:
        """Like ``SshConnection.read``: only a regular file, never through a symlink, and the
        checks hold for what is actually open (O_NOFOLLOW, O_NONBLOCK: a FIFO cannot block)."""
        path = on_node(remote)
        try:
            regular_size(self.node.name, remote, os.lstat(path))
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise NodeError(f"node {self.node.name}: cannot read {remote}: {exc.strerror}") \
                from None
        try:
            size = regular_size(self.node.name, remote, os.fstat(fd))
            data = os.pread(fd, max(0, max_bytes), offset) if offset < size else b""
            return data, max(size, offset + len(data))
        finally:
            os.close(fd)

    def close(self) -> None:
        pass

"""Where iadeep keeps its state, and how the inventory file is found.

One directory holds everything the controller owns (database, socket, logs, models):
``$IADEEP_HOME`` if set, else ``$XDG_STATE_HOME/iadeep``, else ``~/.local/state/iadeep``.
A lab that shares one controller sets ``IADEEP_HOME`` (e.g. ``/var/lib/iadeep``) for everyone.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

# What a member is told when their commands look in their own default state directory, where
# no controller runs: a lab's controller lives elsewhere (e.g. /var/lib/iadeep).
SET_IADEEP_HOME = "set IADEEP_HOME to your lab's state directory (ask your admin)"


def replace_file(target: Path, data: str | bytes, *, mode: int | None = None,
                 durable: bool = False) -> None:
    """Write ``data`` (text, as UTF-8, or bytes as they are) to ``target`` atomically: a reader
    sees the old file or the new one, whole (written beside it, then renamed over it).
    ``mode``: the new file's permissions; ``durable``: on disk (fsync) before the rename.
    Raises OSError, leaving the old file and no temporary one."""
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def iadeep_home_set() -> bool:
    """Whether ``$IADEEP_HOME`` chooses the state directory (else it is this account's own
    default, where a lab's shared controller never is)."""
    return bool(os.environ.get("IADEEP_HOME"))


@dataclass(frozen=True)
class StateDir:
    """The state directory and the name of every file the controller keeps in it: the one
    place these names are spelled."""

    root: Path

    @classmethod
    def default(cls) -> StateDir:
        """``$IADEEP_HOME``, else ``$XDG_STATE_HOME/iadeep``, else ``~/.local/state/iadeep``
        (read at each call: tests and tools point ``IADEEP_HOME`` elsewhere)."""
        env = os.environ.get("IADEEP_HOME")
        if env:
            return cls(Path(env).expanduser())
        xdg = os.environ.get("XDG_STATE_HOME")
        base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
        return cls(base / "iadeep")

    @property
    def db(self) -> Path:
        """The database (0600: it holds every job's environment and arguments)."""
        return self.root / "iadeep.db"

    @property
    def install_id(self) -> Path:
        """A marker written next to the database once it exists: a state directory that has
        one but no database lost its database, and the controller refuses to start over
        silently."""
        return self.root / "install_id"

    @property
    def public_view(self) -> Path:
        """The world-readable views the controller leaves for readers without database
        access."""
        return self.root / "public.json"

    @property
    def socket(self) -> Path:
        return self.root / "controller.sock"

    @property
    def lock(self) -> Path:
        """Held (flock) by the one controller of this directory, for its lifetime."""
        return self.root / "controller.lock"

    @property
    def scripts(self) -> Path:
        """Copies of submitted scripts, taken when a job is accepted (0700)."""
        return self.root / "scripts"

    @property
    def known_hosts(self) -> Path:
        """iadeep's own known_hosts, written by ``iadeep nodes trust`` (the user's is read
        too)."""
        return self.root / "known_hosts"

    @property
    def inventory(self) -> Path:
        """The inventory read when neither ``--inventory`` nor ``$IADEEP_INVENTORY`` names
        one."""
        return self.root / "nodes.yaml"


def inventory_path(explicit: str | os.PathLike | None = None) -> Path:
    """``--inventory FILE``, else ``$IADEEP_INVENTORY``, else ``nodes.yaml`` in the state dir."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("IADEEP_INVENTORY")
    if env:
        return Path(env).expanduser()
    return StateDir.default().inventory


def file_problem(path: str | os.PathLike) -> str | None:
    """None if ``path`` is a regular file (or a link to one), else what it is instead:
    "not found", "is a directory", "is not a regular file (a character device)" (``/dev/null``)
    ... so a message names the real mistake instead of calling every such path missing."""
    import stat

    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return "is a broken symbolic link" if p.is_symlink() else "not found"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a named pipe" if stat.S_ISFIFO(mode) else "a socket")
    return f"is not a regular file ({kind})"

"""Where iadeep keeps its state, and how the inventory file is found.

One directory holds everything the controller owns (database, socket, logs, models):
``$IADEEP_HOME`` if set, else ``$XDG_STATE_HOME/iadeep``, else ``~/.local/state/iadeep``.
A lab that shares one controller sets ``IADEEP_HOME`` (e.g. ``/var/lib/iadeep``) for everyone.
"""
from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    env = os.environ.get("IADEEP_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "iadeep"


def db_path(home: Path | None = None) -> Path:
    """The database (0600: it holds every job's environment and arguments)."""
    return (home or state_dir()) / "iadeep.db"


def install_id_path(home: Path | None = None) -> Path:
    """A marker written next to the database once it exists: a state directory that has one
    but no database lost its database, and the controller refuses to start over silently."""
    return (home or state_dir()) / "install_id"


def public_view_path(home: Path | None = None) -> Path:
    """The world-readable views the controller leaves for readers without database access."""
    return (home or state_dir()) / "public.json"


def socket_path() -> Path:
    return state_dir() / "controller.sock"


def known_hosts_path() -> Path:
    """iadeep's own known_hosts, written by ``iadeep nodes trust`` (the user's is read too)."""
    return state_dir() / "known_hosts"


def inventory_path(explicit: str | os.PathLike | None = None) -> Path:
    """``--inventory FILE``, else ``$IADEEP_INVENTORY``, else ``nodes.yaml`` in the state dir."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("IADEEP_INVENTORY")
    if env:
        return Path(env).expanduser()
    return state_dir() / "nodes.yaml"

"""The controller's guards on its state directory: the right database, and room to write.

- **Which database belongs here.** The database's random install id is also written to a marker
  file beside it. A state directory with a marker but no database (deleted, a lost volume, a
  wrong ``IADEEP_HOME`` mount) or with another installation's database is refused at start:
  starting over silently would forget every job and reuse their ids. Starting fresh is a
  deliberate act (``iadeep controller run --new-database``).
- **Room to write.** Below ``RESERVE_BYTES`` free the controller refuses new jobs but keeps
  recording what the jobs it accepted do (each round writes a few pages), so a full disk
  degrades the service instead of stopping it half-way.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from ..errors import StoreError
from ..paths import StateDir, replace_file
from . import Store, cluster, rescue_path, state_dir_full

RESERVE_BYTES = 16 * 2**20


def open_store(state: StateDir, *, new_database: bool = False) -> tuple[Store, str]:
    """Open the controller's database in ``state``; returns (store, install id).

    Refuses a missing, empty or foreign database where the marker says this directory had
    one, unless ``new_database``."""
    path, marker = state.db, state.install_id
    expected = _read_marker(marker)
    if expected is not None and not path.exists():
        if not new_database:
            raise _refusal(path, f"is missing, but this state directory had one (install "
                                 f"{expected})")
        for suffix in ("-wal", "-shm"):   # a removed database's journal must not replay
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
    store = Store(path)
    try:
        with store.tx() as conn:
            found = cluster.get_meta(conn, "install_id")
            if found is not None and found == expected:
                return store, found
            if expected is not None and not new_database:
                what = "is empty" if found is None else f"belongs to install {found}"
                raise _refusal(path, f"{what}, but this state directory's is install {expected}")
            if found is None:
                found = uuid.uuid4().hex[:12]
                cluster.set_meta(conn, "install_id", found)
        _write_marker(marker, found)
    except BaseException:
        store.close()
        raise
    return store, found


def room_problem(home: Path) -> StoreError | None:
    """A StoreError if less than RESERVE_BYTES are free for the state directory, else None."""
    st = os.statvfs(home)
    return None if st.f_bavail * st.f_frsize >= RESERVE_BYTES else state_dir_full(home)


def _refusal(path: Path, what: str) -> StoreError:
    rescued = rescue_path(path)
    restore = (f"move {rescued} (the copy the controller saved) to {path}" if rescued.exists()
               else f"restore {path} from a backup")
    return StoreError(f"the state database {path} {what}; refusing to start over with no jobs",
                      hint=f"{restore}, or start with an empty database deliberately: "
                           "iadeep controller run --new-database")


def _read_marker(marker: Path) -> str | None:
    try:
        return marker.read_text().strip() or None
    except FileNotFoundError:
        return None


def _write_marker(marker: Path, install_id: str) -> None:
    if _read_marker(marker) == install_id:
        return
    replace_file(marker, install_id + "\n", mode=0o644, durable=True)

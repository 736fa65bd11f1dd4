"""``iadeep nodes check`` / ``trust`` as core calls (the CLI only renders what these return)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import IadeepError, NotFoundError
from ..settings import Inventory
from ..snapshot import ClusterSnapshot

if TYPE_CHECKING:
    from .ssh import ScannedKey


def check_nodes(inventory: Inventory, connect_timeout: float = 5.0,
                command_timeout: float = 20.0) -> ClusterSnapshot:
    """Poll every node once over fresh connections (what `nodes check` reports)."""
    from .poller import NodePool

    with NodePool(inventory, connect_timeout=connect_timeout,
                  command_timeout=command_timeout) as pool:
        return pool.poll_all()


def check_run_as(inventory: Inventory, connect_timeout: float = 5.0,
                 command_timeout: float = 20.0) -> dict[str, tuple[str | None, str | None]]:
    """For each ``run_as: submitter`` node: (the allowed user tried, why running a job as them
    fails, or None when ``sudo -n -u USER true`` works there)."""
    from .poller import NodePool
    from .runas import probe

    names = [n.name for n in inventory.nodes if n.submitter]
    if not names:
        return {}
    with NodePool(inventory, connect_timeout=connect_timeout,
                  command_timeout=command_timeout) as pool:
        out: dict[str, tuple[str | None, str | None]] = {}
        for name in names:
            try:
                out[name] = probe(pool, name)
            except IadeepError as exc:
                out[name] = (None, exc.message)
        return out


def scan_node_key(inventory: Inventory, name: str, connect_timeout: float = 5.0
                  ) -> ScannedKey:
    """The host key a node offers now, compared with the known_hosts files (a ScannedKey)."""
    from .ssh import SshConnection

    node = inventory.node(name)
    if node is None:
        known = ", ".join(n.name for n in inventory.nodes) or "none"
        raise NotFoundError(f"no node named {name!r} in the inventory (known: {known})",
                            hint="check the name in the inventory file")
    if node.local:
        raise NotFoundError(f"node {name!r} is the local machine; it has no SSH host key to trust")
    return SshConnection(node, connect_timeout=connect_timeout).scan_host_key()


def trust_key(scanned: ScannedKey, path: Path | None = None) -> Path:
    from .ssh import record_host_key

    return record_host_key(scanned, path)

"""Shell completion of what the commands name: job ids, node names, workload labels.

typer calls these while the user presses Tab (``iadeep --install-completion`` sets it up). Each
reads what any user may read (the controller, or its public snapshot while it is down; the
inventory for node names) and offers the values that start with what was typed. On any error it
offers nothing: completion must never print an error into the user's command line.
"""
from __future__ import annotations

from collections.abc import Callable


def _matching(values: Callable[[], list[str]], incomplete: str) -> list[str]:
    try:
        found = values()
    except Exception:   # a down controller, an unreadable inventory: nothing to offer
        return []
    return sorted({v for v in found if v.startswith(incomplete)}, key=lambda v: (len(v), v))


def _jobs() -> list[str]:
    from .. import messages as m
    from ..controller import client

    jobs, _ = client.read(m.ListRequest(all_states=False))
    refs = [str(j.id) for j in jobs]
    refs += [f"{j.array_id}_{j.array_index}" for j in jobs if j.array_id is not None]
    refs += [str(j.array_id) for j in jobs if j.array_id is not None]
    return refs


def _nodes() -> list[str]:
    from ..inventory import load_inventory

    return [n.name for n in load_inventory().nodes]


def _workloads() -> list[str]:
    from .. import messages as m
    from ..controller import client

    views, _ = client.read(m.ProfilesRequest())
    return [v.profile.workload for v in views]


def job_ids(incomplete: str) -> list[str]:
    """Unfinished jobs' ids (and array tasks as ``ID_INDEX``)."""
    return _matching(_jobs, incomplete)


def node_names(incomplete: str) -> list[str]:
    """The inventory's node names."""
    return _matching(_nodes, incomplete)


def workloads(incomplete: str) -> list[str]:
    """Known workload profile labels."""
    return _matching(_workloads, incomplete)

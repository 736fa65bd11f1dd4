"""A node renamed in the inventory keeps its jobs.

A reload that drops node ``a`` and adds ``b`` at the very same place (same host, port and
account, and the same job directories there) has renamed the node: the jobs recorded on ``a``
run on ``b``'s GPUs. Left on ``a`` they would be lost for a name no poll reads any more, their
GPUs counted empty (an ``--exclusive`` job placed on top of them) and no fence could name them.
So they follow the node: their node (and any abandoned attempt recorded there) becomes ``b``,
each with an event that says so, before the next round reads them.

Job directories are under ``<workdir>/<install id>/<node name>/`` (``runtime._scoped_workdirs``),
so a renamed node keeps its first name there (``DIRS`` in the meta table: name -> directory
name): its running jobs' directories are found, and its next jobs' go beside them.

A node whose backend keeps no job directories (``Features.job_dirs``: a batch system's, which
lists its nodes itself) cannot be matched this way: its jobs are lost as for a removed node, and
`iadeep nodes fence OLD-NAME` settles them.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from ..jobs import ACTIVE, JobState
from ..nodes.backend import features
from ..settings import Inventory, Node
from ..store import Store, jobrows
from ..store.cluster import get_meta, set_meta

log = logging.getLogger("iadeep.controller")
ACTOR = "controller"


DIRS = "node_dirs"   # meta: a renamed node's name -> the name its directories are under


def _place(node: Node) -> tuple | None:
    """Where a node's jobs are: equal for two names of the same node; None when that cannot
    be told from the inventory alone (see the module docstring)."""
    if not features(node.backend).job_dirs:
        return None
    return (node.local, node.host, node.port, node.user, node.workdir.rstrip("/"), node.run_as)


def dir_names(store: Store) -> dict[str, str]:
    """Renamed nodes' directory names (name -> the name their job directories are under)."""
    with store.tx() as conn:
        return dict(get_meta(conn, DIRS, {}))


def renamed(old: Inventory, new: Inventory) -> dict[str, str]:
    """Old name -> new name for every node the reload renamed (one old node at the same place
    as exactly one new node; an ambiguous place renames nothing)."""
    gone = [n for n in old.nodes if new.node(n.name) is None]
    came = [n for n in new.nodes if old.node(n.name) is None]
    out = {}
    for node in gone:
        place = _place(node)
        if place is None:
            continue
        olds = [n for n in gone if _place(n) == place]
        news = [n for n in came if _place(n) == place]
        if len(olds) == 1 and len(news) == 1:
            out[node.name] = news[0].name
    return out


def carry(store: Store, renames: dict[str, str], clock: Callable[[], float]) -> list[int]:
    """Move the jobs recorded on each renamed node to its new name; returns their ids."""
    moved: list[int] = []
    if not renames:
        return moved
    with store.tx() as conn:
        dirs = get_meta(conn, DIRS, {})
        for was, now in renames.items():
            dirs[now] = dirs.pop(was, was)
        set_meta(conn, DIRS, {k: v for k, v in dirs.items() if k != v})
        for job in jobrows.select(conn, states=ACTIVE | {JobState.LOST, JobState.HELD}):
            orphans = tuple(renames.get(n, n) for n in job.orphans)
            if job.node not in renames and orphans == job.orphans:
                continue
            fields: dict = {"orphans": orphans}
            if job.node in renames:
                fields["node"] = renames[job.node]
            jobrows.update(conn, job.id, **fields)
            why = (f"its node {job.node} was renamed {fields['node']} in the inventory"
                   if "node" in fields else
                   "a node of its abandoned attempts was renamed in the inventory")
            jobrows.add_event(conn, job.id, clock(), job.state, job.state, why, ACTOR)
            moved.append(job.id)
    for old, new in renames.items():
        log.info("node %s is now named %s; its jobs follow it", old, new)
    return moved

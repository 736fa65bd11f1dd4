"""`iadeep nodes drain/resume` answered (the round reads the drained nodes through
``store.cluster.drain_waits``).

A drained node (Slurm's DRAIN) takes no new jobs; the jobs running there finish as they would.
It is for maintenance that can wait for them (a driver update, a disk swap): `nodes fence` stays
for nodes that are dead. Admins drain and resume (``service.OPERATIONS`` checks); the state is
in the database, so a drain outlives a controller restart, and `status`, the monitor and the web
page show it.
"""
from __future__ import annotations

from typing import Any

from ... import messages as m
from ...errors import InputError
from ...jobs import ACTIVE
from ...store import cluster, jobrows

MAX_REASON = 200   # characters: it is shown on one line wherever the node is


def op_drain(service: Any, user: str, req: m.DrainRequest) -> m.DrainResult:
    if service.inventory.node(req.node) is None:
        known = ", ".join(n.name for n in service.inventory.nodes) or "none"
        raise InputError(f"no node named {req.node!r} in the controller's inventory",
                         hint=f"known nodes: {known}")
    with service.store.tx() as conn:
        running = tuple(j.id for j in jobrows.select(conn, states=ACTIVE, node=req.node))
        if req.resume:
            was = cluster.clear_drained(conn, req.node)
            changed, drained = was is not None, False
        else:
            reason = " ".join((req.reason or "").split())
            if not reason:
                raise InputError("a drain needs a reason, shown wherever the node is",
                                 hint=f"e.g. iadeep nodes drain {req.node} --reason 'driver "
                                      "update'")
            if len(reason) > MAX_REASON:
                raise InputError(f"--reason is {len(reason)} characters; at most {MAX_REASON}",
                                 hint="say it in a line")
            changed = req.node not in cluster.drained(conn)
            cluster.set_drained(conn, req.node, reason, user, service.clock())
            drained = True
    service.wake()   # a resumed node takes jobs at once
    return m.DrainResult(req.node, drained, changed, running)


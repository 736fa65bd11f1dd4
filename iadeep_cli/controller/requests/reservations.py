"""`iadeep reserve add/list/delete` answered (the reservations each round plans with are read by
``controller/reservations.py``, which both rooms share).

Admins add and delete (``service.OPERATIONS`` checks); anyone lists them. A reservation is
refused (one line) when it starts further ahead than ``lab.reservation_ahead`` (it would idle
GPUs long before), is for someone who could not run jobs on the GPUs it covers (``admission``:
an account outside a submitter node's allowed users, root), asks more GPUs than its node (or
the cluster) has, or would overbook them: at no time may the reservations on a node, or in
the cluster, add up to more GPUs than there are (by the inventory's ``gpus``, else the last
poll; a node never polled is not counted against).
"""
from __future__ import annotations

import pwd
import sqlite3
from typing import Any

from ... import messages as m
from ...errors import InputError, PermissionDenied
from ...settings import Inventory
from ...store import cluster, reservations as rows
from ...text import duration
from ..reservations import views_of
from . import admission

# A reservation longer than this is surely a typo (a year instead of a day).
MAX_LENGTH_S = 90 * 86400.0


def op_add(service: Any, user: str, req: m.ReserveAddRequest) -> m.ReservationView:
    now = service.clock()
    try:
        pwd.getpwnam(req.for_user)
    except KeyError:
        raise InputError(f"no user {req.for_user!r} on this machine",
                         hint="give the login name of the account that submits the jobs") \
            from None
    if req.gpus < 1:
        raise InputError(f"--gpus must be 1 or more, got {req.gpus}", hint="e.g. --gpus 2")
    if req.node is not None and service.inventory.node(req.node) is None:
        known = ", ".join(n.name for n in service.inventory.nodes) or "none"
        raise InputError(f"no node named {req.node!r} in the controller's inventory",
                         hint=f"known nodes: {known}")
    if not req.end > req.start:
        raise InputError("a reservation must end after it starts",
                         hint="give --duration as e.g. 8h or 2d")
    if req.end <= now:
        raise InputError("that window is over already", hint="give a --start in the future")
    if req.end - req.start > MAX_LENGTH_S:
        raise InputError(f"a reservation may last at most {MAX_LENGTH_S / 86400:.0f} days",
                         hint="give a shorter --duration")
    inventory: Inventory = service.inventory
    if req.start - now > inventory.reservation_ahead_s:
        ahead_s = inventory.reservation_ahead_s
        ahead = f"{ahead_s / 86400:g} days" if ahead_s >= 86400 else duration(ahead_s)
        raise InputError(f"a reservation may start at most {ahead} ahead "
                         "(lab.reservation_ahead)", hint="give a sooner --start")
    covered = [n for n in inventory.nodes if req.node in (None, n.name)]
    try:
        admission.check_admitted(req.for_user, covered)
    except PermissionDenied as exc:
        raise InputError(f"--user {req.for_user}: no job of theirs could use the reservation: "
                         f"{exc.message}", hint="reserve for a lab member who runs jobs on "
                         "those nodes") from None
    with service.store.tx() as conn:
        _check_room(conn, inventory, req, now)
        new = rows.add(conn, req.for_user, req.gpus, req.node, req.start, req.end, user, now)
        found = [r for r in rows.current(conn, now) if r[0] == new]
        view = views_of(conn, found, now)[0]
    service.wake()
    return view


def _gpu_counts(conn: sqlite3.Connection, inventory: Inventory) -> dict[str, int | None]:
    """GPUs per inventory node: its ``gpus`` list, else its last good poll's; None if unknown
    (a node whose every poll so far failed is stored with no GPUs: unknown, not none)."""
    polled = {s.name: len(s.gpus) for s, _ in cluster.load_nodes(conn) if s.ok or s.gpus}
    return {n.name: len(n.gpus) if n.gpus is not None else polled.get(n.name)
            for n in inventory.nodes}


def _peak(found: list[rows.Row], start: float, end: float) -> int:
    """The most GPUs the reservations ``found`` hold at once within [start, end)."""
    overlapping = [r for r in found if r[4] < end and r[5] > start]
    moments = {start} | {r[4] for r in overlapping if r[4] > start}
    return max((sum(r[2] for r in overlapping if r[4] <= t < r[5]) for t in moments),
               default=0)


def _check_room(conn: sqlite3.Connection, inventory: Inventory, req: m.ReserveAddRequest,
                now: float) -> None:
    """InputError if ``req`` asks more GPUs than its node (or the cluster) has, or would,
    with the reservations already there, hold more than that at some moment."""
    counts = _gpu_counts(conn, inventory)
    found = rows.current(conn, now)
    if req.node is not None and counts.get(req.node) is not None:
        room, where = counts[req.node] or 0, f"node {req.node}"
        same = [r for r in found if r[3] == req.node]
    elif None not in counts.values() and counts:
        room, where = sum(c or 0 for c in counts.values()), "the cluster"
        same = found
    else:
        return    # a node never polled: how many GPUs there are is not known yet
    if req.gpus > room:
        raise InputError(f"--gpus {req.gpus}: {where} has {room} GPU(s)",
                         hint=f"give --gpus {room} or fewer")
    taken = _peak(same, req.start, req.end)
    if req.gpus + taken > room:
        raise InputError(f"--gpus {req.gpus} would overbook {where}: other reservations hold "
                         f"{taken} of its {room} GPU(s) at some time in that window",
                         hint="`iadeep reserve list` shows them; reserve fewer GPUs, another "
                              "window, or delete one")
    if req.node is not None and None not in counts.values():   # the cluster's total too
        total = sum(c or 0 for c in counts.values())
        taken = _peak(found, req.start, req.end)
        if req.gpus + taken > total:
            raise InputError(f"--gpus {req.gpus} would overbook the cluster: other "
                             f"reservations hold {taken} of its {total} GPU(s) at some time "
                             "in that window",
                             hint="`iadeep reserve list` shows them; reserve fewer GPUs, "
                                  "another window, or delete one")


def op_list(service: Any, user: str, req: m.ReserveListRequest) -> list[m.ReservationView]:
    now = service.clock()
    with service.store.read() as conn:
        return views_of(conn, rows.current(conn, now), now)


def op_delete(service: Any, user: str, req: m.ReserveDeleteRequest) -> m.ReservationView:
    with service.store.tx() as conn:
        row = rows.delete(conn, req.id)
    service.wake()
    return m.ReservationView(id=row[0], user=row[1], gpus=row[2], node=row[3], start=row[4],
                             end=row[5], created_by=row[6])

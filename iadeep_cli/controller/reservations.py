"""`iadeep reserve add/list/delete` answered, and the reservations each round plans with.

Admins add and delete (``service.OPERATIONS`` checks); anyone lists them. The scheduling
round reads the reservations not yet over (``load``) and hands them to ``plan()`` as data
(``scheduler.reservations`` decides which GPUs they hold and who keeps off them).
"""
from __future__ import annotations

import pwd
import sqlite3
from typing import Any

from .. import messages as m
from ..errors import InputError
from ..jobs import ACTIVE
from ..scheduler.reservations import Reservation, assign
from ..store import Store, cluster, jobrows, reservations as rows

# A reservation longer than this is surely a typo (a year instead of a day).
MAX_LENGTH_S = 90 * 86400.0


def _value(row: rows.Row) -> Reservation:
    return Reservation(id=row[0], user=row[1], gpus=row[2], node=row[3], start=row[4],
                       end=row[5])


def load(store: Store, now: float) -> list[Reservation]:
    """The reservations not over at ``now`` (read once a round)."""
    with store.tx() as conn:
        return [_value(r) for r in rows.current(conn, now)]


def _views(conn: sqlite3.Connection, found: list[rows.Row], now: float
           ) -> list[m.ReservationView]:
    """Each reservation with the GPUs it holds by the nodes' last poll (as a round would
    assign them)."""
    snaps = [n for n, _ in cluster.load_nodes(conn)]
    active = jobrows.select(conn, states=ACTIVE)
    slots = [_Slot(s.name, g.index, tuple(j.id for j in active if j.node == s.name
                                          and g.index in j.gpu_indices))
             for s in snaps for g in s.gpus]
    held = assign([_value(r) for r in found], slots, {j.id: j.owner for j in active}, now)
    return [m.ReservationView(id=r[0], user=r[1], gpus=r[2], node=r[3], start=r[4], end=r[5],
                              created_by=r[6], held=held.get(r[0], ())) for r in found]


def status(conn: sqlite3.Connection, now: float) -> tuple[m.ReservationView, ...] | None:
    """The reservations for `iadeep status` (the monitor); None from a database older than
    reservations (a reader that may not migrate it)."""
    try:
        found = rows.current(conn, now)
    except sqlite3.OperationalError:
        return None
    return tuple(_views(conn, found, now)) or None


class _Slot:
    def __init__(self, node: str, index: int, job_ids: tuple[int, ...]):
        self.node, self.index, self.job_ids = node, index, job_ids


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
    with service.store.tx() as conn:
        new = rows.add(conn, req.for_user, req.gpus, req.node, req.start, req.end, user, now)
        found = [r for r in rows.current(conn, now) if r[0] == new]
        view = _views(conn, found, now)[0]
    service.wake()
    return view


def op_list(service: Any, user: str, req: m.ReserveListRequest) -> list[m.ReservationView]:
    now = service.clock()
    with service.store.read() as conn:
        return _views(conn, rows.current(conn, now), now)


def op_delete(service: Any, user: str, req: m.ReserveDeleteRequest) -> m.ReservationView:
    with service.store.tx() as conn:
        row = rows.delete(conn, req.id)
    service.wake()
    return m.ReservationView(id=row[0], user=row[1], gpus=row[2], node=row[3], start=row[4],
                             end=row[5], created_by=row[6])

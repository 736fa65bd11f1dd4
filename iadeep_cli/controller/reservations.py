"""The reservations each round plans with (``load``) and the monitor shows (``status``);
`iadeep reserve add/list/delete` is answered by ``requests/reservations.py``.

The scheduling round reads the reservations not yet over (``load``) and hands them to
``plan()`` as data (``scheduler.reservations`` decides which GPUs they hold and who keeps off
them).
"""
from __future__ import annotations

import sqlite3

from .. import messages as m
from ..jobs import ACTIVE
from ..scheduler.reservations import Reservation, assign
from ..store import Store, cluster, jobrows, reservations as rows


def value_of(row: rows.Row) -> Reservation:
    return Reservation(id=row[0], user=row[1], gpus=row[2], node=row[3], start=row[4],
                       end=row[5])


def load(store: Store, now: float) -> list[Reservation]:
    """The reservations not over at ``now`` (read once a round)."""
    with store.tx() as conn:
        return [value_of(r) for r in rows.current(conn, now)]


def views_of(conn: sqlite3.Connection, found: list[rows.Row], now: float
           ) -> list[m.ReservationView]:
    """Each reservation with the GPUs it holds by the nodes' last poll (as a round would
    assign them)."""
    snaps = [n for n, _ in cluster.load_nodes(conn)]
    active = jobrows.select(conn, states=ACTIVE)
    slots = [_Slot(s.name, g.index, tuple(j.id for j in active if j.node == s.name
                                          and g.index in j.gpu_indices))
             for s in snaps for g in s.gpus]
    held = assign([value_of(r) for r in found], slots, {j.id: j.owner for j in active}, now)
    return [m.ReservationView(id=r[0], user=r[1], gpus=r[2], node=r[3], start=r[4], end=r[5],
                              created_by=r[6], held=held.get(r[0], ())) for r in found]


def status(conn: sqlite3.Connection, now: float) -> tuple[m.ReservationView, ...] | None:
    """The reservations for `iadeep status` (the monitor); None from a database older than
    reservations (a reader that may not migrate it)."""
    try:
        found = rows.current(conn, now)
    except sqlite3.OperationalError:
        return None
    return tuple(views_of(conn, found, now)) or None


class _Slot:
    def __init__(self, node: str, index: int, job_ids: tuple[int, ...]):
        self.node, self.index, self.job_ids = node, index, job_ids

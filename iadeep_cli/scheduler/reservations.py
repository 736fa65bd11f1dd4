"""Reservations: GPUs an admin keeps for one user over a window of time (`iadeep reserve add`).

Pure, as ``placement.plan()`` is: the caller passes the reservations in as data, and ``plan()``
asks ``assign`` once per round which GPUs each one holds and ``rule`` per job whether it must
keep off them. A job of anyone but the reservation's user may not start on its GPUs if its time
limit would carry it into the window (one already inside the window likewise); a job without a
time limit may run past any start, so it keeps off the GPUs of every reservation not yet over.
The reservation's user's jobs may use them (and any other GPU) as always.

Which GPUs a reservation holds is chosen afresh each round (nothing is booked ahead): on its
node (or, without one, on the node that has enough GPUs and the fewest of others' jobs on them),
the GPUs with the fewest jobs of other users, then the lowest indices; two reservations never
hold the same GPU. A GPU still busy with another user's job when the window opens stays so until
that job ends (nothing is stopped for a reservation); the time limit rule keeps that from
happening to jobs started after the reservation was made.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..jobs import Job
from ..text import clock, duration


@dataclass(frozen=True)
class Reservation:
    """``gpus`` GPUs (on ``node``, or any one node) kept for ``user`` from ``start`` to ``end``
    (epoch seconds)."""

    id: int
    user: str
    gpus: int
    node: str | None
    start: float
    end: float

    def crosses(self, now: float, time_limit_s: float | None) -> bool:
        """Whether a job started ``now`` with this time limit would still run in the window."""
        if now >= self.end:
            return False
        return time_limit_s is None or now + time_limit_s > self.start

    def describe(self, now: float) -> str:
        what = f"reservation {self.id} for {self.user}"
        if self.start <= now:
            return f"{what} until {clock(self.end)}"
        return f"{what} from {clock(self.start)} for {duration(self.end - self.start)}"


class _Slot(Protocol):
    @property
    def node(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def job_ids(self) -> tuple[int, ...]: ...


# reservation id -> the GPU names ("node:index") it holds this round
Held = Mapping[int, tuple[str, ...]]


def assign(reservations: Sequence[Reservation], slots: Sequence[_Slot],
           owners: Mapping[int, str], now: float) -> Held:
    """The GPUs each reservation not yet over holds this round (see the module's docstring);
    ``owners``: job id -> its user, for the jobs on the slots. A reservation whose node has
    fewer GPUs up than it wants holds those it has."""
    taken: set[str] = set()
    held: dict[int, tuple[str, ...]] = {}
    for r in sorted(reservations, key=lambda r: (r.start, r.id)):
        if now >= r.end:
            continue

        def others(s: _Slot, user: str = r.user) -> int:
            return sum(1 for j in s.job_ids if owners.get(j) != user)

        free = [s for s in slots if f"{s.node}:{s.index}" not in taken]
        by_node: dict[str, list[_Slot]] = {}
        for s in free:
            by_node.setdefault(s.node, []).append(s)
        if r.node is not None:
            candidates = by_node.get(r.node, [])
        else:
            fitting = [(sum(sorted(others(s) for s in ss)[:r.gpus]), n)
                       for n, ss in by_node.items() if len(ss) >= r.gpus]
            candidates = by_node[min(fitting)[1]] if fitting else []
        chosen = sorted(candidates, key=lambda s: (others(s), s.index))[:r.gpus]
        names = tuple(f"{s.node}:{s.index}" for s in sorted(chosen, key=lambda s: s.index))
        taken.update(names)
        held[r.id] = names
    return held


def rule(reservations: Sequence[Reservation], held: Held, job: Job,
         ok: Callable[[Any], bool], now: float) -> tuple[Callable[[Any], bool], str]:
    """(which GPUs ``job`` may use, the note its wait reason gets): ``ok`` itself (the same
    object) and "" when no reservation keeps it off a GPU; else ``ok`` without the GPUs held
    for others whose window its time limit would reach, and a note naming those reservations."""
    blocked: set[str] = set()
    notes = []
    for r in reservations:
        gpus = held.get(r.id, ())
        if r.user == job.owner or not gpus or not r.crosses(now, job.spec.time_limit_s):
            continue
        blocked.update(gpus)
        notes.append(f"{','.join(gpus)} kept by {r.describe(now)}")
    if not blocked:
        return ok, ""
    limit = "" if job.spec.time_limit_s is not None else \
        "; a job without --time may run into it: give one that ends before it starts"
    note = f" (GPUs {'; '.join(notes)}{limit})"
    return (lambda g: g.name not in blocked and ok(g)), note


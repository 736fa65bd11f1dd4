"""Host RAM and CPUs as Slurm counts them (``--mem``, ``--cpus-per-task``), counted where the
inventory gives a node's ``host_mem`` and ``cpus`` (pure, like ``plan()``).

A node's room is what it has less what its active jobs asked for (a job without
``--cpus-per-task`` counts as one CPU, as a Slurm task; without ``--mem`` as no RAM). Before
``plan()`` a queued job that asks for either is kept off the nodes without room for it (for
``plan()`` only: its spec's ``exclude`` gets them); after it, the round's placements are
admitted in order, so two jobs that fit a node one at a time never start there together
beyond its room (the later one waits for the next round). A node without ``host_mem``/``cpus``
in the inventory is not counted on (Slurm's own limits apply on a Slurm node).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..jobs import Job, JobSpec
from ..settings import Node


@dataclass
class Room:
    """What a node has left: MiB of host RAM and CPUs (None: not counted there)."""

    mem_mib: int | None
    cpus: int | None

    def fits(self, spec: JobSpec) -> bool:
        return ((self.mem_mib is None or (spec.host_mem_mib or 0) <= self.mem_mib)
                and (self.cpus is None or (spec.cpus_per_task or 1) <= self.cpus))

    def take(self, spec: JobSpec) -> None:
        if self.mem_mib is not None:
            self.mem_mib -= spec.host_mem_mib or 0
        if self.cpus is not None:
            self.cpus -= spec.cpus_per_task or 1

    def said(self) -> str:
        parts = ([] if self.mem_mib is None else [f"{max(self.mem_mib, 0)}M RAM"]) + \
            ([] if self.cpus is None else [f"{max(self.cpus, 0)} CPUs"])
        return " and ".join(parts)


def asks(spec: JobSpec) -> bool:
    """Whether the job asked for host resources at all (``--mem`` or ``--cpus-per-task``)."""
    return spec.host_mem_mib is not None or spec.cpus_per_task is not None


def rooms(nodes: Iterable[Node], active: Sequence[Job]) -> dict[str, Room]:
    """Each counted node's room, its active jobs' asks taken."""
    out = {n.name: Room(n.host_mem_mib, n.cpus) for n in nodes
           if n.host_mem_mib is not None or n.cpus is not None}
    for job in active:
        if job.node in out:
            out[job.node].take(job.spec)
    return out


def restrict(queue: Sequence[Job], room: dict[str, Room]) -> tuple[list[Job], dict[int, str]]:
    """The queue as ``plan()`` should see it: each job that asks for host resources kept off
    the counted nodes without room for it (its spec's ``exclude``, a copy), and why, for the
    jobs so kept off some node (the reason if it then waits)."""
    out, why = [], {}
    for job in queue:
        full = sorted(name for name, r in room.items() if asks(job.spec) and not r.fits(job.spec))
        if not full:
            out.append(job)
            continue
        spec = dataclasses.replace(job.spec, exclude=tuple(dict.fromkeys(
            (*job.spec.exclude, *full))))
        out.append(dataclasses.replace(job, spec=spec))
        why[job.id] = waiting_reason(job.spec, {n: room[n] for n in full})
    return out, why


def waiting_reason(spec: JobSpec, full: dict[str, Room]) -> str:
    asked = " ".join(x for x in (
        f"--mem {spec.host_mem_mib}M" if spec.host_mem_mib is not None else "",
        f"--cpus-per-task {spec.cpus_per_task}" if spec.cpus_per_task is not None else "") if x)
    left = ", ".join(f"{name} has {r.said()} left" for name, r in sorted(full.items()))
    return f"waiting for host RAM or CPUs ({asked}): {left}"

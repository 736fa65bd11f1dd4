"""What every step of the round works with (``Context``), what one round has found so far
(``Round``), and the base of a step (``Step``): every step is ``run(round)``."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ...jobopts import run_dir_note
from ...jobs import Job, JobState
from ...nodes.connection import Pool
from ...profiles import Profile
from ...settings import Inventory
from ...snapshot import ClusterSnapshot
from ...store import Store, jobrows
from ..presence import Presence
from .actions import NodeActions

ACTOR = "controller"


@dataclasses.dataclass
class Context:
    """The controller's parts every step shares: the store, the lab (inventory) and its node
    pool, the per-node action workers and the clock.  One object, owned by the loop: a reloaded
    inventory replaces ``inventory`` and ``pool`` here (``SchedulingLoop.use``), so every step,
    and every action already queued on a node's worker, uses the new ones from then on."""

    store: Store
    inventory: Inventory
    pool: Pool
    actions: NodeActions
    clock: Callable[[], float]
    # the jobs the round reads, decoded once while their rows stay unchanged (swept each round)
    decoded: jobrows.Decoded = dataclasses.field(default_factory=jobrows.Decoded)
    # when each `run --pty` job's client was last heard from (the service notes it)
    presence: Presence = dataclasses.field(default_factory=Presence)

    def jobs(self, states: Iterable[JobState], node: str | None = None) -> list[Job]:
        """The jobs in ``states`` (on ``node``), oldest first, read in a transaction of their
        own (which writes nothing: the same question asked again, this round or the next,
        before any job changed is answered from the last read, see ``jobrows.Decoded``)."""
        states = tuple(states)
        query = (frozenset(states), node)
        with self.store.tx() as conn:
            now = jobrows.version(conn)
            kept = self.decoded.answer(query, now)
            if kept is not None:
                return kept
            found = jobrows.select(conn, states=states, node=node, decoded=self.decoded)
            self.decoded.keep(query, now, found)
            return found

    def move(self, job: Job, new: JobState, reason: str, **fields: Any) -> Job:
        """``job`` to ``new`` (checked against the state machine), as the controller, now; the
        job as it is after."""
        with self.store.tx() as conn:
            return jobrows.transition(conn, job.id, new, reason, ACTOR, self.clock(), **fields)

    def requeue(self, job: Job, reason: str, *, started: bool, **fields: Any) -> Job:
        """``job`` back to the queue, its attempt dropped (``store.jobrows.requeue``)."""
        with self.store.tx() as conn:
            return jobrows.requeue(conn, job.id, reason, ACTOR, self.clock(), started=started,
                                   **fields)

    def run_dir(self, job: Job) -> str:
        """Where the job runs on its node and why (--chdir, the shared submission directory,
        or its job directory), for `queue why`: '' or a part that starts with a space."""
        if not (job.spec.workdir or job.spec.submit_dir):
            return ""   # submitted through the API without either: as always
        node = self.inventory.node(job.node or "")
        return " " + run_dir_note(job.spec, job.node or "", node.shared_paths if node else ())


@dataclasses.dataclass
class Round:
    """One round as its steps find it, handed to each in turn (``RoundStep.run``): when it
    began and with which lab, then what the poll saw (``snapshot``), the profiles in effect
    (``profiles``, and the lab's own: ``lab``) and the running jobs' observed speeds
    (``speeds``), each filled in by the step that finds it."""

    now: float
    inventory: Inventory
    snapshot: ClusterSnapshot = dataclasses.field(default_factory=lambda: ClusterSnapshot(0.0))
    profiles: dict[str, Profile] = dataclasses.field(default_factory=dict)
    lab: dict[str, Profile] = dataclasses.field(default_factory=dict)
    speeds: dict[int, float] = dataclasses.field(default_factory=dict)
    # labels with no profile yet that plan() places under a provisional one this round
    # (steps/profile.py, ``policy.cold_start: share``), and what such a job does (its reason)
    provisional: dict[str, Profile] = dataclasses.field(default_factory=dict)
    cold_start: str = ""


class RoundStep(Protocol):
    """A step of the round: what the loop calls, in its order, once a round."""

    def run(self, r: Round) -> None:
        """Do this step's part of round ``r`` (and fill in what it finds there)."""


class OnContext:
    """Reads the controller's shared parts through ``self.ctx`` (``Context``): ``store``,
    ``inventory``, ``pool``, ``actions``, ``clock`` are always the context's current ones (a
    reload replaces them there), and ``jobs``/``move`` are its job reads and moves. The loop
    and every step are built on it."""

    ctx: Context

    @property
    def store(self) -> Store:
        return self.ctx.store

    @property
    def inventory(self) -> Inventory:
        return self.ctx.inventory

    @property
    def pool(self) -> Pool:
        return self.ctx.pool

    @property
    def actions(self) -> NodeActions:
        return self.ctx.actions

    @property
    def clock(self) -> Callable[[], float]:
        return self.ctx.clock

    def jobs(self, states: Iterable[JobState], node: str | None = None) -> list[Job]:
        """The jobs in ``states`` (on ``node``), oldest first."""
        return self.ctx.jobs(states, node)

    def move(self, job: Job, new: JobState, reason: str, **fields: Any) -> Job:
        """``job`` to ``new``, as the controller, now (checked against the state machine)."""
        return self.ctx.move(job, new, reason, **fields)


class Step(OnContext):
    """A step of the round, over the controller's shared parts (``OnContext``)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def _run_dir(self, job: Job) -> str:
        return self.ctx.run_dir(job)

"""A waiting job's effective priority: the one formula the placer ranks its queue by
(``order_queue``), the monitor numbers its queue rows by (``tui.viewmodel``) and `queue why`
shows in parts (``controller.fairshare.priority_view``):

    effective = priority + aging_per_hour x hours waited + the owner's fair-share points

Ties go to the older submission, then the smaller id (``queue_key``). Pure: the caller says
what "now" is and hands in the fair-share points (``scheduler.fairshare.points``; None while
fair share is off), so the controller, the simulator and a reader rank a queue alike.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter

from ..jobs import Job
from ..settings import Policy


def recorded_aging(value: float | None) -> float:
    """The aging rate a reader knows from the controller's heartbeat (``ControllerView``):
    the lab's default where it recorded none (a controller older than the field)."""
    return Policy().aging_per_hour if value is None else value


def aging(submitted_at: float, now: float, aging_per_hour: float) -> float:
    """The points a job submitted at ``submitted_at`` has gained by waiting until ``now``."""
    return aging_per_hour * (max(0.0, now - submitted_at) / 3600.0)


def effective(priority: float, owner: str, submitted_at: float, now: float,
              aging_per_hour: float, fairshare: Mapping[str, float] | None = None) -> float:
    """Priority plus ageing, so a low-priority job eventually outranks newer high ones, plus
    its owner's fair-share points (None, or an owner not in it: 0)."""
    bonus = fairshare.get(owner, 0.0) if fairshare else 0.0
    return priority + aging(submitted_at, now, aging_per_hour) + bonus


def queue_key(priority: float, owner: str, submitted_at: float, job_id: int, now: float,
              aging_per_hour: float, fairshare: Mapping[str, float] | None = None
              ) -> tuple[float, float, int]:
    """Sort key of a waiting job: highest effective priority first, then oldest, then id."""
    return (-effective(priority, owner, submitted_at, now, aging_per_hour, fairshare),
            submitted_at, job_id)


def effective_priority(job: Job, policy: Policy, now: float,
                       fairshare: Mapping[str, float] | None = None) -> float:
    """``effective`` of a queued ``Job`` under the lab's ``policy``."""
    return effective(job.spec.priority, job.owner, job.submitted_at, now,
                     policy.aging_per_hour, fairshare)


def order_queue(queue: Sequence[Job], policy: Policy, now: float,
                fairshare: Mapping[str, float] | None = None) -> list[Job]:
    """``queue`` in the order the placer considers it (``queue_key``)."""
    per_hour = policy.aging_per_hour
    if not fairshare and per_hour >= 0 and len(set(map(_priority, queue))) <= 1:
        # one priority and no fair share: effective priority falls as submission time rises
        # (ageing is monotonic), so the order is (submitted_at, id), without a key per job
        # built from floats (the simulator ranks queues of thousands each event)
        return sorted(queue, key=_submitted)
    return sorted(queue, key=lambda j: queue_key(j.spec.priority, j.owner, j.submitted_at,
                                                 j.id, now, per_hour, fairshare))


_submitted = attrgetter("submitted_at", "id")
_priority = attrgetter("spec.priority")

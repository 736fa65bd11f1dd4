"""A waiting job's effective priority: the one formula the placer ranks its queue by
(``order_queue``), the monitor numbers its queue rows by (``tui.viewmodel``) and `queue why`
shows in parts (``controller.fairshare.priority_view``):

    effective = priority + aging_per_hour x hours waited + the owner's fair-share points

Ties go to the older submission, then the smaller id (``queue_key``). Pure: the caller says
what "now" is and hands in the fair-share points (``scheduler.fairshare.points``; None while
fair share is off), so the controller, the simulator and a reader rank a queue alike.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any, overload

from ..jobs import Job, JobSpec
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
    if isinstance(queue, RankedQueue):
        if not fairshare and per_hour >= 0 and queue.one_priority():
            return queue.ranked()   # already in that order
    elif not fairshare and per_hour >= 0 and len(set(map(_priority, queue))) <= 1:
        # one priority and no fair share: effective priority falls as submission time rises
        # (ageing is monotonic), so the order is (submitted_at, id), without a key per job
        # built from floats (the simulator ranks queues of thousands each event)
        return sorted(queue, key=_submitted)
    return sorted(queue, key=lambda j: queue_key(j.spec.priority, j.owner, j.submitted_at,
                                                 j.id, now, per_hour, fairshare))


_submitted = attrgetter("submitted_at", "id")
_priority = attrgetter("spec.priority")


def placement_fields(spec: JobSpec) -> tuple[Any, ...]:
    """The spec fields ``plan()`` places a job by: two jobs with the same ones are alike to a
    short round (``placement._like``, which adds the round's backfill horizon)."""
    return (spec.workload, spec.min_speed, spec.mem_gib, spec.gpus, spec.exclusive,
            spec.constraint, spec.nodelist, spec.exclude)


def alike_class(job: Job) -> tuple[Any, ...]:
    """What ``plan()``'s short rounds call two jobs alike by, less the round's backfill
    horizon (which reads only the owner, label and time limit, all here): the same
    placement fields, its owner and its time limit."""
    return (placement_fields(job.spec), job.owner, job.spec.time_limit_s)


class RankedQueue(Sequence[Job]):
    """Queued jobs kept in submission order ((submitted_at, id)) as they come and go, so a
    caller that plans round after round over a long queue (the simulator: thousands of
    jobs, tens of thousands of rounds) hands ``plan()`` a queue already ranked instead of
    one sorted again each round. ``order_queue`` returns it as it is where its order is
    submission order (one priority, no fair share); besides, it keeps per class of alike
    jobs (``alike_class``) the last one in that order, so a short round can tell, without
    passing over the rest of the queue, that every job still to come is like one that
    could not start. A plain sequence of jobs to read; ``add`` and ``pop`` change it."""

    __slots__ = ("_jobs", "_keys", "_by_id", "_priorities", "_arrays", "_classes")

    def __init__(self, jobs: Iterable[Job] = ()):
        self._jobs: list[Job] = []
        self._keys: list[tuple[float, int]] = []
        self._by_id: dict[int, Job] = {}
        self._priorities: Counter[float] = Counter()
        self._arrays = 0
        # alike class -> its jobs' keys, in order
        self._classes: dict[tuple[Any, ...], list[tuple[float, int]]] = {}
        for job in jobs:
            self.add(job)

    def add(self, job: Job) -> None:
        if job.id in self._by_id:
            self.pop(job.id)
        key = (job.submitted_at, job.id)
        at = bisect_right(self._keys, key)
        self._keys.insert(at, key)
        self._jobs.insert(at, job)
        self._by_id[job.id] = job
        self._priorities[job.spec.priority] += 1
        self._arrays += job.array_id is not None
        insort(self._classes.setdefault(alike_class(job), []), key)

    def pop(self, job_id: int) -> Job:
        job = self._by_id.pop(job_id)
        key = (job.submitted_at, job.id)
        at = bisect_left(self._keys, key)
        del self._keys[at]
        del self._jobs[at]
        self._priorities[job.spec.priority] -= 1
        if not self._priorities[job.spec.priority]:
            del self._priorities[job.spec.priority]
        self._arrays -= job.array_id is not None
        cls = alike_class(job)
        keys = self._classes[cls]
        del keys[bisect_left(keys, key)]
        if not keys:
            del self._classes[cls]
        return job

    def __len__(self) -> int:
        return len(self._jobs)

    @overload
    def __getitem__(self, i: int) -> Job: ...

    @overload
    def __getitem__(self, i: slice) -> list[Job]: ...

    def __getitem__(self, i: int | slice) -> Job | list[Job]:
        return self._jobs[i]

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs)

    def __contains__(self, job: object) -> bool:
        return isinstance(job, Job) and self._by_id.get(job.id) == job

    def get(self, job_id: int) -> Job | None:
        return self._by_id.get(job_id)

    def one_priority(self) -> bool:
        return len(self._priorities) <= 1

    def has_arrays(self) -> bool:
        return self._arrays > 0

    def ranked(self) -> list[Job]:
        """The jobs in submission order, a list of the caller's own."""
        return list(self._jobs)

    def last_of_classes_after(self, job: Job) -> list[Job]:
        """For each alike class with a job after ``job`` in submission order, its last one."""
        key = (job.submitted_at, job.id)
        by_id = self._by_id
        return [by_id[keys[-1][1]] for keys in self._classes.values() if keys[-1] > key]

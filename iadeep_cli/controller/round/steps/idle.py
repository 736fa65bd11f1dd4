"""Idle GPU holders: a running job whose GPUs show (near) zero utilisation for too long.

Every round, each running job on a node that answered is looked at: when every one of its GPUs
reports a utilisation at or below ``lab.idle_util`` (default 5 %), its idle spell starts (or
goes on); any poll above that ends it. A spell of ``lab.idle_after`` (default 30 min) makes the
job idle, once per attempt:

- it is marked: its reason reads ``idle: GPU node1:0 at or below 5% for 30m``, which `queue list`,
  `queue why`, the monitor and the web page show, and an event records it (`queue show`);
- its owner is told through the notification channels (``notify.py``: the event is a
  ``running -> running`` one whose reason starts with ``idle:``; sent whatever ``--notify``);
- ``lab.idle_action`` is taken: ``notify`` (only the above), ``cancel`` (stopped like a cancel,
  "cancelled by iadeep:idle"), or ``requeue`` (stopped and queued again, once: a job that is
  idle again on a later attempt is only marked and notified).

Spells are kept in memory: a restarted controller starts counting again (a job is never called
idle sooner than it is).
"""
from __future__ import annotations

import logging

from ....jobs import Job, JobState, StopReason
from ....settings import IdleSettings
from ....snapshot import ClusterSnapshot
from ....store import cluster, jobrows
from ....text import duration
from ...jobfault import guarded
from ..context import Context, Round

log = logging.getLogger("iadeep.controller")
ACTOR = "controller"
PREFIX = "idle:"   # how an idle job's mark reads (`queue list`); never read back


class IdleWatch:
    """The running jobs' idle spells: (job id, attempt) -> when its GPUs went idle."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.since: dict[tuple[int, int], float] = {}
        self.seen: dict[tuple[int, int], float] = {}   # the spell's last poll, for GPU-hours

    def run(self, r: Round) -> None:
        self.step(self.ctx, r.snapshot, r.now)

    def step(self, loop: Context, snapshot: ClusterSnapshot, now: float) -> list[int]:
        """Look at every running job once; the ids of those that became idle this round."""
        settings = loop.inventory.idle
        answered = {n.name for n in snapshot.nodes if n.reached}
        running = loop.jobs({JobState.RUNNING})
        alive = {(j.id, j.attempts) for j in running}
        self.since = {k: v for k, v in self.since.items() if k in alive}
        self.seen = {k: v for k, v in self.seen.items() if k in self.since}
        became = []
        wasted: dict[str, float] = {}     # user -> idle GPU-seconds this round
        for job in running:
            if job.node not in answered or not job.gpu_indices or job.stop_reason:
                continue
            if guarded(job, "idle check", False, self._check, loop, snapshot, job, now,
                       settings, wasted):
                became.append(job.id)
        if wasted:
            with loop.store.tx() as conn:
                total = cluster.get_meta(conn, cluster.IDLE_GPU_SECONDS, {})
                for user, seconds in wasted.items():
                    total[user] = total.get(user, 0.0) + seconds
                cluster.set_meta(conn, cluster.IDLE_GPU_SECONDS, total)
        return became

    def _check(self, loop: Context, snapshot: ClusterSnapshot, job: Job, now: float,
               settings: IdleSettings, wasted: dict[str, float]) -> bool:
        """One running job's idle spell: whether it became idle this round."""
        gpus = [snapshot.gpu(job.node, i) for i in job.gpu_indices]
        utils = [g.utilization_gpu if g is not None else None for g in gpus]
        key = (job.id, job.attempts)
        if any(u is None or u > settings.util for u in utils):
            self.since.pop(key, None)
            self.seen.pop(key, None)
            if job.idle_marked:
                with loop.store.tx() as conn:   # busy again: the mark goes, the event stays
                    jobrows.update(conn, job.id, reason="busy again after being idle",
                                   idle_marked=False)
            return False
        since = self.since.setdefault(key, now)
        if key in self.seen:      # idle at this poll and the last: the time between counts
            wasted[job.owner] = (wasted.get(job.owner, 0.0)
                                 + (now - self.seen[key]) * len(job.gpu_indices))
        self.seen[key] = now
        after = job.spec.idle_after_s or settings.after_s      # --idle-after wins
        if now - since < after or job.idle_since is not None:
            return False
        self._mark(loop, job, since, now, settings)
        return True

    @staticmethod
    def _mark(loop: Context, job: Job, since: float, now: float, settings: IdleSettings) -> None:
        reason = mark(job, settings.util, now - since)
        action = settings.action
        if action == "requeue" and job.idle_requeued:
            action = "notify"                       # requeued once already: only told
        stop = {"cancel": StopReason.IDLE, "requeue": StopReason.IDLE_REQUEUE}.get(action)
        said = reason + {"notify": "", "cancel": "; cancelling it",
                         "requeue": "; requeueing it (once)"}[action]
        with loop.store.tx() as conn:
            jobrows.update(conn, job.id, idle_since=since, idle_marked=True, reason=said,
                           **({"stop_reason": stop} if stop else {}))
            jobrows.add_event(conn, job.id, now, JobState.RUNNING, JobState.RUNNING, said, ACTOR,
                              kind=jobrows.IDLE)
        log.warning("job %d (%s/%s) %s", job.id, job.owner, job.name, said)


def mark(job: Job, util: float, idle_s: float) -> str:
    """An idle job's mark, as `queue list` and its owner's notice show it."""
    where = ",".join(f"{job.node}:{i}" for i in job.gpu_indices)
    return (f"{PREFIX} GPU{'s' if len(job.gpu_indices) > 1 else ''} {where} at or below "
            f"{util:g}% for {duration(idle_s)}")


def requeued(loop: Context, job: Job) -> bool:
    """For ``steps/ends.py`` when a job's attempt ends: queue a job stopped for idleness again
    (once); False for any other job. Its attempt has ended on its node, so a new one may
    start (``store.jobrows.requeue``: the attempt dropped whole, its node remembered)."""
    if job.stop_reason is None or not job.stop_reason.requeues:
        return False
    idle_s = loop.clock() - (job.idle_since if job.idle_since is not None else loop.clock())
    why = f"{mark(job, loop.inventory.idle.util, idle_s)}; requeued once"
    job = loop.move(job, JobState.LOST, "stopped for idleness")
    loop.requeue(job, why, started=True,
                 stop_reason=None, idle_since=None, idle_marked=False, idle_requeued=True)
    return True

"""Step: lose the jobs of nodes silent past their grace period (and admin fencing).

The rule that keeps a job from running twice: a job's next attempt starts only once its previous
attempt is known to have ended: its node answered and the attempt is gone (reconcile), or an
admin fenced the node (``iadeep nodes fence``: "it is powered off, its jobs are dead"). A node
whose nvidia-smi fails still answers over SSH, so its jobs are still tracked; only a node that
does not answer at all for ``node_grace`` loses its jobs, and lost jobs wait for one of the two.
"""
from __future__ import annotations

from ....jobs import ACTIVE, Job, JobState
from ....store import cluster
from ..context import Context, Round, Step
from .ends import Ends, stopped


def _then(job: Job) -> str:
    """What happens next to a job lost with its node, as its retries decide (``Ends.requeue``)."""
    fence = f"`iadeep nodes fence {job.node}`"
    if job.attempts - job.checkpoints > job.spec.retries:
        return (f"no retries left, so it is not requeued: it ends as the node says once it "
                f"answers, or fails when an admin runs {fence}")
    return (f"it is requeued when the node answers and its attempt is gone, or when an admin "
            f"runs {fence}")


class Lose(Step):
    def __init__(self, ctx: Context, ends: Ends):
        super().__init__(ctx)
        self.ends = ends

    def run(self, r: Round) -> None:
        self.lose(r.now)

    def lose(self, now: float) -> None:
        """Jobs on nodes silent past the grace period, or no longer in the inventory, are lost.
        They are not requeued here: their attempt may still run (see the module docstring)."""
        with self.store.tx() as conn:
            silent = {n.name for n, since in cluster.load_nodes(conn)
                      if since is not None and now - since >= self.inventory.node_grace_s}
        known = {n.name for n in self.inventory.nodes}
        for job in self.jobs(ACTIVE):
            if job.node in silent:
                self._lose(job, f"node {job.node} silent for over "
                                f"{self.inventory.node_grace_s:.0f}s; " + _then(job))
            elif job.node not in known:
                self._lose(job, f"node {job.node} is no longer in the inventory")

    def _lose(self, job: Job, why: str) -> None:
        lost = self.move(job, JobState.LOST, why)
        if lost.stop_reason:
            new, why = stopped(lost)
            self.move(lost, new, f"{why}, while its node was lost",
                       ended_at=self.clock(), orphans=lost.orphans_with(lost.node))

    def fence(self, node: str, by: str) -> list[int]:
        """An admin declares every attempt on ``node`` dead (powered off, gone for good): its
        lost and active jobs are requeued if they have retries left, else failed. Should the
        node come back, those attempts are stopped before anything else starts there."""
        moved = []
        for job in self.jobs(ACTIVE | {JobState.LOST}, node):
            why = f"node {node} fenced by {by}"
            if not self.ends.requeue(job, why):
                self.move(job, JobState.FAILED, f"{why}; no retries left", ended_at=self.clock(),
                           orphans=job.orphans_with(node))
            moved.append(job.id)
        return moved

"""Step: stop the jobs whose cancel was asked for (by their owner, an admin, or the time
limit), on their node's worker; the poll then sees them exit and reconcile ends them."""
from __future__ import annotations

import logging
from functools import partial

from ....errors import IadeepError
from ....jobs import ACTIVE, JobState
from ....snapshot import ClusterSnapshot
from ..context import Round, Step

log = logging.getLogger("iadeep.controller")


class Cancels(Step):
    def run(self, r: Round) -> None:
        self.send(r.snapshot)

    def send(self, snapshot: ClusterSnapshot) -> None:
        """Stop cancelled jobs on their node's worker; the poll then sees them exit (a held job
        with a node is one its backend's queue keeps pending and held: cancelled there too).

        A stop is sent again only once a poll that began after the last one ended has been
        reconciled and still shows the job: sending it every round would, when a stop takes
        longer than the gap between polls (a loaded node), end each one after the next poll
        began, and reconcile (which waits for a poll newer than the job's last action) would
        never see the job exit."""
        polled = {node.name: node.taken_at for node in snapshot.nodes if node.reached}
        for job in self.jobs(ACTIVE | {JobState.HELD}):
            if not job.stop_reason or job.node is None:
                continue
            if self.actions.acted_at(job.id) >= polled.get(job.node, float("inf")):
                continue   # its last action is newer than this poll: the next poll tells
            self.actions.submit(job.node, ("cancel", job.id),
                                partial(self._stop, job.node, job.id, job.owner))

    def _stop(self, node: str, job_id: int, owner: str) -> None:
        try:
            self.pool.backend(node).cancel(job_id, grace_s=self.inventory.kill_grace_s,
                                           owner=owner)
        except IadeepError as exc:
            log.warning("cancel of job %s on %s failed: %s", job_id, node, exc.message)

"""Step: clean up on the nodes: abandoned attempts, and finished jobs' old directories."""
from __future__ import annotations

import logging
from functools import partial

from ....errors import IadeepError
from ....snapshot import ClusterSnapshot
from ....store import cluster, jobrows
from ..context import ACTOR, Round, Step

log = logging.getLogger("iadeep.controller")
CLEAN_EVERY_S = 600.0   # old job directories are looked for on each node at most this often


class Clean(Step):
    """``orphans(node)`` for each node that answered (right after its reconcile), ``old_dirs``
    once a round, at its end (``run``); the work itself runs on each node's worker."""

    def run(self, r: Round) -> None:
        self.old_dirs(r.snapshot, r.now)

    def orphans(self, node: str) -> None:
        """Stop abandoned attempts on a node that answers again (a requeued or cancelled job's
        old process), and set their directories aside so a new attempt there starts fresh."""
        with self.store.tx() as conn:
            jobs = [j for j in jobrows.with_orphans(conn) if node in j.orphans]
        for job in jobs:
            self.actions.submit(node, ("orphan", job.id, node),
                                partial(self._stop_orphan, node, job.id, job.owner))

    def _stop_orphan(self, node: str, job_id: int, owner: str) -> None:
        try:
            self.pool.backend(node).cancel(job_id, grace_s=5, owner=owner)
            self.pool.backend(node).set_aside(job_id, "abandoned", owner=owner)
        except IadeepError as exc:
            log.warning("stopping old attempt of job %s on %s: %s", job_id, node, exc.message)
            return
        with self.store.tx() as conn:   # re-read: the job may have moved meanwhile
            fresh = jobrows.get(conn, job_id)
            jobrows.update(conn, job_id, orphans=fresh.orphans_without(node))
            jobrows.add_event(conn, job_id, self.clock(), fresh.state, fresh.state,
                              f"its abandoned attempt on {node} was stopped and its directory "
                              "set aside", ACTOR)
        log.info("stopped the abandoned attempt of job %s on %s", job_id, node)

    def old_dirs(self, snapshot: ClusterSnapshot, now: float) -> None:
        """Remove finished jobs' directories on their nodes once they are older than
        ``lab.job_dir_retention``, at most every CLEAN_EVERY_S per node.  What was cleaned is
        remembered as a time per node (jobs ended up to then), so nothing is scanned twice and
        a controller that was down catches up."""
        keep = self.inventory.job_dir_retention_s
        cutoff, every = now - keep, min(CLEAN_EVERY_S, max(1.0, keep))
        with self.store.tx() as conn:
            done = cluster.get_meta(conn, "dirs_cleaned_until", {})
        for node in snapshot.nodes:
            since = float(done.get(node.name, 0.0))
            if not node.reached or cutoff - since < every:
                continue
            with self.store.tx() as conn:
                ids = jobrows.ended_between(conn, node.name, since, cutoff)
                owners = {i: jobrows.get(conn, i).owner for i in ids}
            self.actions.submit(node.name, ("clean", -1, node.name),
                                partial(self._clean, node.name, ids, cutoff, owners))

    def _clean(self, node: str, ids: list[int], until: float, owners: dict[int, str]) -> None:
        try:
            # One batch per owner: on a run_as: submitter node each owner's are theirs to remove.
            batches = ({"": ids} if not self.pool.node(node).submitter else
                       {o: [i for i in ids if owners[i] == o]
                        for o in sorted(set(owners.values()))})
            for owner, mine in batches.items():
                for start in range(0, len(mine), 200):   # bounded command lines
                    self.pool.backend(node).clean(mine[start:start + 200],
                                                  owner=owner or None)
        except IadeepError as exc:
            log.warning("cleaning old job directories on %s: %s", node, exc.message)
            return
        with self.store.tx() as conn:
            done = cluster.get_meta(conn, "dirs_cleaned_until", {})
            cluster.set_meta(conn, "dirs_cleaned_until", {**done, node: until})
        if ids:
            log.info("removed %d finished jobs' directories on %s", len(ids), node)

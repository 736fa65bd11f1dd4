"""Step: poll every node and record what it says."""
from __future__ import annotations

import logging

from ....jobs import ACTIVE, JobState
from ....snapshot import ClusterSnapshot
from ....store import cluster
from ..context import Context, Round, Step
from ..observer import SpeedObserver

log = logging.getLogger("iadeep.controller")


class Poll(Step):
    """Every node's GPUs and the state of its jobs, in one round trip a node (``Pool.poll_all``:
    the round waits for the nodes only ``wait_s``; a slow node's answer is used when it comes),
    saved for the monitor; a node going silent or coming back is logged once."""

    def __init__(self, ctx: Context, observer: SpeedObserver):
        super().__init__(ctx)
        self.observer = observer   # controller/round/observer.SpeedObserver: progress offsets
        self._seen: dict[str, tuple[bool, bool]] = {}   # node -> (reached, GPU data ok)

    def run(self, r: Round) -> None:
        r.snapshot = self.read(self.wait_s)

    @property
    def wait_s(self) -> float:
        """How long a round waits for slow nodes: never longer than one poll interval, so one
        sick node cannot make every other node's data old."""
        return min(max(1.0, self.inventory.poll_interval_s), 10.0)

    def read(self, wait_s: float) -> ClusterSnapshot:
        expected, owners = self._expected()
        # the running jobs' new progress comes with their node's poll (one command a node; at
        # most observe.PROGRESS_READS_PER_NODE files a node a round, in turns)
        progress = self.observer.offsets(self.jobs({JobState.RUNNING}))
        snapshot = self.pool.poll_all(expected, wait_s=wait_s, owners=owners,
                                      progress=progress)
        with self.store.tx() as conn:
            cluster.save_nodes(conn, snapshot.nodes)
            cluster.forget_nodes(conn, {n.name for n in self.inventory.nodes})
        self._log_node_changes(snapshot)
        return snapshot

    def _expected(self) -> tuple[dict[str, list[tuple[int, int | None, int | None]]],
                                 dict[int, str]]:
        """Per node, the jobs whose state its poll must read, with their recorded leader; and
        their owners (a ``run_as: submitter`` node reads each job as its owner)."""
        out: dict[str, list[tuple[int, int | None, int | None]]] = {}
        owners: dict[int, str] = {}
        # a held job with a node is one its backend keeps pending, held there too (_apply_held)
        for job in self.jobs(ACTIVE | {JobState.LOST, JobState.HELD}):
            if job.node is not None:
                out.setdefault(job.node, []).append((job.id, job.remote_pid, job.remote_start))
                owners[job.id] = job.owner
        return out, owners

    def _log_node_changes(self, snapshot: ClusterSnapshot) -> None:
        """A node going silent or coming back, its GPU query failing or recovering: the lab's
        events, logged once when they happen (not every round)."""
        for node in snapshot.nodes:
            now_seen = (node.reached, node.ok)
            before = self._seen.get(node.name, (True, True))
            self._seen[node.name] = now_seen
            if now_seen == before:
                continue
            if not node.reached:
                log.warning("node %s does not answer: %s", node.name, node.error)
            elif not before[0]:
                log.info("node %s answers again", node.name)
            if node.reached and not node.ok:
                log.warning("node %s answers, but its GPUs cannot be read: %s (its jobs are "
                            "still tracked; nothing new is placed there)", node.name, node.error)
            elif node.reached and not before[1]:
                log.info("node %s: GPU data available again", node.name)

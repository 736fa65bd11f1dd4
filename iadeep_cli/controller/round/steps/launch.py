"""Starting a placement: recorded first (``starting``, committed), then launched on the node's
worker, so a job is never started twice (``Launches``); and the nodes whose launches fail."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ....errors import IadeepError, InvalidTransition, NodeError, OwnerFilesError, RunAsRefused
from ....jobs import Job, JobState
from ....nodes.backend import features
from ....scheduler.placement import Placement
from ....store import jobrows
from ....text import gpus_at
from ..context import ACTOR, Context, Step
from .backoff import Backoff, LaunchHealth
from .ends import Ends

log = logging.getLogger("iadeep.controller")


class Launches(Step):
    def __init__(self, ctx: Context, ends: Ends, launch_health: Backoff, scripts_dir: Path):
        super().__init__(ctx)
        self.ends = ends
        self._launch_health = launch_health
        self.scripts_dir = scripts_dir

    def start(self, job: Job, placement: Placement) -> None:
        """Record the placement (committed before anything happens on the node), then launch
        on the node's worker; the round goes on without waiting for it."""
        speeds = placement.predicted_speeds
        why = f"; {placement.note}" if placement.note else ""   # the GPU model decided
        # one transaction: nobody reads the job starting beside its partners while they still
        # show the speeds predicted for them before it came
        with self.store.tx() as conn:
            started = jobrows.transition(
                conn, job.id, JobState.STARTING,
                f"placed on {gpus_at(placement.node, placement.gpu_indices)}{why}", ACTOR,
                self.clock(), **{**jobrows.no_attempt(), "node": placement.node,   # afresh
                                 "gpu_indices": placement.gpu_indices},
                attempts=job.attempts + 1, predicted_speed=speeds.get(job.id),
                # a preemption's note is for while it waits (its events keep it)
                **({"preempted": None} if job.preempted else {}))
            for other, speed in speeds.items():
                if other != job.id:
                    jobrows.update(conn, other, predicted_speed=speed)
        self.actions.submit(placement.node, ("launch", job.id),
                            lambda: self._launch(started, placement))

    def _launch(self, started: Job, placement: Placement) -> None:
        node = placement.node
        try:
            result = self.pool.backend(node).launch(started, placement.gpu_indices,
                                                    self.script_copy(started))
        except RunAsRefused as exc:
            self._run_as_refused(started, node, exc)
            return
        except OwnerFilesError as exc:
            self._owner_files_failed(started, node, exc)
            return
        except NodeError as exc:
            # Unknown whether it started: the next poll's reconcile finds out.
            skipped = self._launch_failed(node, exc.message)
            log.warning("launch of job %s on %s failed: %s; %s is skipped for %.0f s",
                        started.id, node, exc.message, node, skipped)
            return
        except IadeepError as exc:
            self.move(started, JobState.FAILED, f"could not launch: {exc.message}",
                       ended_at=self.clock())
            return
        if node in self._launch_health:
            log.info("node %s launches jobs again", node)
            self._launch_health.pop(node, None)
        if result.waiting:   # its backend's queue: the poll says when it runs (_apply_remote)
            label = features(self.pool.backend(node).kind).label
            with self.store.tx() as conn:
                held = jobrows.get(conn, started.id).state == JobState.HELD   # meanwhile
                jobrows.update(conn, started.id, remote_pid=result.pid, **({} if held else {
                    "reason": f"submitted to {label} as job {result.pid}; waiting for {label} "
                              "to start it"}))
            return
        try:
            model = f"; {placement.note}" if placement.note else ""   # why this GPU model
            self.move(started, JobState.RUNNING, "running on "
                       f"{gpus_at(node, placement.gpu_indices)}{self._run_dir(started)}"
                       f"{model}",
                       remote_pid=result.pid, remote_start=result.start,
                       started_at=self.clock())
        except InvalidTransition:   # reconcile got there first (it ran, and maybe ended)
            pass

    def _run_as_refused(self, started: Job, node: str, exc: RunAsRefused) -> None:
        """The launch could not run as the job's owner, so nothing of it ran (``runas``).  This
        user's account (missing there, not allowed, root, the SSH account) fails the job with
        the reason: it would fail the same way next time.  A node that refuses everyone (sudo
        or its rule missing) is a node problem: it is skipped a while (as for any failing
        launch) and the job goes back to the queue at once, for another node."""
        if not exc.node_wide:
            log.warning("job %s cannot run as %s on %s: %s", started.id, started.owner, node,
                        exc.message)
            self.move(started, JobState.FAILED, f"could not launch: {exc.message}",
                       ended_at=self.clock())
            return
        skipped = self._launch_failed(node, exc.message)
        log.warning("launch of job %s on %s refused: %s; %s is skipped for %.0f s",
                    started.id, node, exc.message, node, skipped)
        self.ends.not_started(started)

    def _owner_files_failed(self, started: Job, node: str, exc: OwnerFilesError) -> None:
        """The owner's home on ``node`` took neither the job's directory nor its script (full,
        not writable): nothing of it ran. That counts against this owner's job, not the node
        (which stays in use for everyone else): the job is held with the reason, for its
        owner to see in `queue why` and release once the home is fixed."""
        log.warning("job %s of %s held: %s", started.id, started.owner, exc.message)
        if started.stop_reason:
            self.ends.not_started(started)
            return
        now = self.clock()
        with self.store.tx() as conn:
            jobrows.requeue(conn, started.id, "launch did not happen", ACTOR, now,
                            started=False)
            jobrows.transition(conn, started.id, JobState.HELD,
                               f"{exc.message} (hint: {exc.hint})", ACTOR, now)

    def _launch_failed(self, node: str, reason: str) -> float:
        """A launch on ``node`` failed or was refused node-wide: back off; the seconds it is
        skipped."""
        return self._launch_health.setdefault(node, LaunchHealth()).failed(reason, self.clock())

    def launch_health(self) -> dict[str, dict[str, Any]]:
        """Nodes skipped because their launches fail: node -> {reason, until}."""
        now = self.clock()
        return {n: {"reason": h.reason, "until": h.until}
                for n, h in self._launch_health.items() if h.until > now}

    def script_copy(self, job: Job) -> Path:
        """The copy of the script taken when the job was submitted (later edits don't leak);
        an array's tasks share the one copy kept under the array's id."""
        return self.scripts_dir / str(job.array_id or job.id) / Path(job.spec.script).name

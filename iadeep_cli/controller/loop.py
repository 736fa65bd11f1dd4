"""One scheduling round: poll -> record -> reconcile -> lose -> cancel -> profile -> schedule.

Why this order: the truth on the nodes (reconcile) is established before anything is decided,
so a restarted controller never starts a job that is already running. A launch is recorded as
``starting`` (with node and GPUs) and committed *before* the job is started on the node; if the
controller dies in between, the next round's reconcile finds either the job's pid file (it did
start: running) or nothing (it did not: queued again). A job is therefore never started twice.

Nodes never wait for each other. Every poll reads a node's GPUs *and* the state of its jobs in
one round trip; the round waits for the nodes only briefly (``round_wait_s``) and a slow node's
answer is used when it comes. What the loop does on a node (launch, cancel, stop an abandoned
attempt) runs on that node's own worker thread (``NodeActions``), so a hung node holds up only
its own work. A job with an action in flight is left alone by reconcile until it is done.

The rule that keeps a job from running twice: a job's next attempt starts only once its previous
attempt is known to have ended: its node answered and the attempt is gone, or an admin fenced
the node (``iadeep nodes fence``: "it is powered off, its jobs are dead"). A node whose
nvidia-smi fails still answers over SSH, so its jobs are still tracked; only a node that does
not answer at all for ``node_grace`` loses its jobs, and lost jobs wait for one of the two.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from ..errors import IadeepError, InvalidTransition, NodeError, OwnerFilesError, RunAsRefused
from ..inventory import Inventory
from ..jobs import ACTIVE, Job, JobState, dependencies, parse_signal, run_dir_note
from ..model.data import shipped_profiles
from ..nodes.connection import Pool
from ..nodes.slurm import held_in_slurm
from ..profiles import Profile
from ..scheduler.gpumodels import ModelSpeeds, model_speeds
from ..scheduler.remaining import Durations
from ..snapshot import ClusterSnapshot, GpuSample
from ..store import Store, cluster, impact, jobs as jobrows, profiles as profrows
from ..text import clock, hms
from .fairshare import FairShareRound
from .tune import SelfTuning

log = logging.getLogger("iadeep.controller")
ACTOR = "controller"
# Who asks to stop a job that ran past its --time, written where a user's name goes
# (``cancel_requested_by``): no account can have this name (":" is not allowed in one).
TIME_LIMIT = "iadeep:time-limit"
PROFILE_SAMPLES = 6   # polls of a job alone on its GPU before its profile is recorded
REFIT_TIMEOUT_S = 1800.0    # a refit child still running after this is killed (and logged)
REFIT_INTERVAL_S = 3600.0   # refit the model at most this often, when new pairs were observed
# placement's run-time history (scheduler/remaining.py): the last 30 days' finished jobs,
# re-read at most every 10 minutes (one indexed query)
RUN_TIMES_WINDOW_S = 30 * 86400.0
RUN_TIMES_REFRESH_S = 600.0
LAUNCH_BACKOFF_S = (30.0, 600.0)   # a node whose launches fail is skipped this long, doubling
CLEAN_EVERY_S = 600.0   # old job directories are looked for on each node at most this often


class NodeActions:
    """One worker thread per node for what the loop does there (launch, cancel, clean up).

    Actions on one node run in order; a node that hangs delays only its own queue.  An action
    is keyed (e.g. ``("launch", 12)``): the same key is not queued twice while one is pending,
    and ``busy(job_id)`` tells reconcile to leave that job alone until its action is done.
    """

    def __init__(self):
        self._workers: dict[str, ThreadPoolExecutor] = {}
        self._pending: set[tuple] = set()
        self._done_at: dict[int, float] = {}   # job id -> when its last action ended
        self._lock = threading.Lock()

    def submit(self, node: str, key: tuple, fn: Callable[[], None]) -> bool:
        with self._lock:
            if key in self._pending:
                return False
            self._pending.add(key)
            worker = self._workers.get(node)
            if worker is None:
                worker = self._workers[node] = ThreadPoolExecutor(
                    1, thread_name_prefix=f"iadeep-{node}")
        worker.submit(self._run, key, fn)
        return True

    def _run(self, key: tuple, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:   # a bug in one action must not kill the node's worker
            log.exception("action %s failed", key)
        finally:
            with self._lock:
                self._pending.discard(key)
                self._done_at[key[1]] = time.time()   # wall clock, like a poll's taken_at

    def busy(self, job_id: int) -> bool:
        with self._lock:
            return any(key[1] == job_id for key in self._pending)

    def acted_at(self, job_id: int) -> float:
        with self._lock:
            return self._done_at.get(job_id, 0.0)

    def drain(self, timeout: float = 10.0) -> None:
        """Wait (bounded) for queued actions: tests and a clean shutdown."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    return
            time.sleep(0.02)

    def close(self) -> None:
        for worker in self._workers.values():
            worker.shutdown(wait=False, cancel_futures=True)


@dataclasses.dataclass
class _LaunchHealth:
    """A node whose launches fail: skipped until ``until``, the delay doubling with each
    failure in a row (LAUNCH_BACKOFF_S) so a broken node costs one attempt per delay, not one
    per round."""
    failures: int = 0
    until: float = 0.0
    reason: str = ""

    def failed(self, reason: str, now: float) -> float:
        """Count one more failure; the seconds the node is now skipped."""
        self.failures += 1
        self.reason = reason
        delay = min(LAUNCH_BACKOFF_S[1], LAUNCH_BACKOFF_S[0] * 2 ** (self.failures - 1))
        self.until = now + delay
        return delay


class SchedulingLoop:
    def __init__(self, store: Store, inventory: Inventory, pool: Pool, scripts_dir: Path,
                 clock: Callable[[], float] = time.time, fit_in_background: bool = True):
        from ..model.predictor import analytic_model
        from .adapt import Adapter
        from .observe import SpeedObserver

        self.store, self.inventory, self.pool = store, inventory, pool
        self.scripts_dir = scripts_dir
        self.clock = clock
        self.model = analytic_model()   # conservative until the fitted model is ready
        self._samples: dict[int, list[tuple[GpuSample, float | None]]] = {}
        self.observer = SpeedObserver(pool)
        self._fit_in_background = fit_in_background
        self._fit_lock = threading.Lock()
        self._fit_running = self._fit_again = False
        self._last_fit = clock()
        self._new_pairs = 0
        self.actions = NodeActions()
        self._launch_health: dict[str, _LaunchHealth] = {}
        self._seen: dict[str, tuple[bool, bool]] = {}   # node -> (reached, GPU data ok)
        self.fairshare = FairShareRound()   # lab.policy.fairshare: usage -> priority points
        self.adapt = Adapter(self)   # run-time adaptation (controller/adapt.py)
        self._durations: tuple[float, Durations] | None = None   # (read at, run times)
        self.tuning = SelfTuning(store, clock())   # self-tuned plan() settings (tune.py)
        self._refit()

    @property
    def round_wait_s(self) -> float:
        """How long a round waits for slow nodes: never longer than one poll interval, so one
        sick node cannot make every other node's data old."""
        return min(max(1.0, self.inventory.poll_interval_s), 10.0)

    def _refit(self) -> None:
        """Refit the model. In the background (the controller): in a child process at low
        priority (controller/refit.py), so a fit never holds this interpreter's lock against a
        round; one at a time, and a request during a fit runs one more afterwards."""
        if not self._fit_in_background:
            self._fit()
            return
        with self._fit_lock:
            if self._fit_running:
                self._fit_again = True
                return
            self._fit_running = True
        threading.Thread(target=self._fit_in_child, name="iadeep-fit", daemon=True).start()

    def _fit_in_child(self) -> None:
        from ..model.predictor import InterferenceModel
        from . import refit

        out = self.store.path.with_name("interference-model.json")
        while True:
            try:
                done = refit.run(self.store.path, out, timeout_s=REFIT_TIMEOUT_S)
                if done.returncode != 0:
                    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    log.error("refitting the interference model failed (exit %s: %s); keeping "
                              "the current model", done.returncode, last)
                else:
                    self.model = InterferenceModel.load(out)
                    log.info("interference model ready: %s", self.model.note)
            except Exception:  # keep scheduling with the current model rather than stop
                log.exception("refitting the interference model failed; keeping the current "
                              "model")
            with self._fit_lock:
                if not self._fit_again:
                    self._fit_running = False
                    return
                self._fit_again = False

    # ------------------------------------------------------------------ model
    def lab_profiles(self) -> dict[str, Profile]:
        """Profiles measured in this lab (they override the shipped ones of the same name)."""
        with self.store.tx() as conn:
            return {p.workload: p for p, _source, _at in profrows.load_profiles(conn)}

    def _fit(self) -> None:
        from ..model.data import shipped_pairs, shipped_profiles
        from ..model.predictor import fit_model
        from .catalog import lab_measurements

        try:
            lab_profiles, lab_pairs = lab_measurements(self.store)
            self.model = fit_model(shipped_profiles(), shipped_pairs(),
                                   extra_profiles=lab_profiles, extra_observations=lab_pairs)
            log.info("interference model ready: %s", getattr(self.model, "note", ""))
        except Exception:  # keep scheduling with the analytic model rather than stop
            log.exception("fitting the interference model failed; using the analytic estimate")

    # ------------------------------------------------------------------ the round
    def tick(self) -> None:
        now = self.clock()
        expected, owners = self._expected()
        # every running job's new progress comes with its node's poll (one command a node)
        progress = self.observer.offsets(self._jobs({JobState.RUNNING}))
        snapshot = self.pool.poll_all(expected, wait_s=self.round_wait_s, owners=owners,
                                      progress=progress)
        with self.store.tx() as conn:
            cluster.save_nodes(conn, snapshot.nodes)
            cluster.forget_nodes(conn, {n.name for n in self.inventory.nodes})
        self._log_node_changes(snapshot)
        for node in snapshot.nodes:
            if node.reached:
                self._reconcile(node)
                self._clean_orphans(node.name)
        self._lose_silent_nodes(now)
        self._stop_overdue(now)
        self._cancel_requested(snapshot)
        shipped, lab = shipped_profiles(), self.lab_profiles()
        lab.update(self._profile_new_workloads(snapshot, {**shipped, **lab}))
        profiles = {**shipped, **lab}
        speeds = self._observe_speeds(snapshot, now, profiles, lab)
        self.adapt.step(now, speeds, snapshot)
        self.adapt.phase_step(now, snapshot, profiles, lab)   # phase changes refresh profiles
        self.tuning.step(now, self.inventory)   # self-tuning: a replay due, or its answer
        self._schedule(snapshot, profiles)
        self._clean_old_dirs(snapshot, now)

    def close(self) -> None:
        self.actions.close()
        self.pool.close()

    def _expected(self) -> tuple[dict[str, list[tuple[int, int | None, int | None]]],
                                 dict[int, str]]:
        """Per node, the jobs whose state its poll must read, with their recorded leader; and
        their owners (a ``run_as: submitter`` node reads each job as its owner)."""
        out: dict[str, list[tuple[int, int | None, int | None]]] = {}
        owners: dict[int, str] = {}
        # a held job with a node is one Slurm keeps pending, held there too (see _apply_held)
        for job in self._jobs(ACTIVE | {JobState.LOST, JobState.HELD}):
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

    def use(self, inventory: Inventory, pool: Pool) -> None:
        """A reloaded inventory and its node pool, from now on (called between rounds)."""
        self.inventory, self.pool, self.observer.pool = inventory, pool, pool

    # ------------------------------------------------------------------ helpers
    def _move(self, job: Job, new: JobState, reason: str, **fields) -> Job:
        with self.store.tx() as conn:
            return jobrows.transition(conn, job.id, new, reason, ACTOR, self.clock(), **fields)

    def _jobs(self, states, node: str | None = None) -> list[Job]:
        with self.store.tx() as conn:
            return jobrows.select(conn, states=states, node=node)

    # ------------------------------------------------------------------ reconcile
    def _reconcile(self, node) -> None:
        """Bring every job we think is on ``node`` in line with what its poll says.

        A job with an action in flight, or whose action ended after this poll began, is left
        for the next round: the poll may predate what the action did (a launch completing)."""
        for job in self._jobs(ACTIVE | {JobState.LOST, JobState.HELD}, node.name):
            if self.actions.busy(job.id) or self.actions.acted_at(job.id) >= node.taken_at:
                continue
            if job.state == JobState.HELD:
                self._apply_held(job, node.job(job.id))
                continue
            self._apply_remote(job, node.job(job.id))

    def _apply_held(self, job: Job, remote) -> None:
        """A held job that Slurm has (it was `starting`, pending there, when it was held):
        iadeep's `held` is what must be, so Slurm is made to hold it (``scontrol hold``, again
        each round until the poll says so: idempotent, and a crash in between is repaired).
        Slurm started it before the hold reached it: it runs, and says so. Its Slurm job gone
        (cancelled there, or never submitted): it stays held, placed anew once released."""
        if remote is None or remote.state == "unknown":
            return   # Slurm did not answer: nothing is known
        if remote.state == "pending":
            if not held_in_slurm(remote.reason):
                self._slurm_hold(job, True)
        elif remote.state == "running":   # back to starting, then running as any start
            job = self._move(job, JobState.STARTING, "not held: Slurm had started it before "
                             "the hold reached it")
            self._apply_remote(job, remote)
        elif job.cancel_requested_by and remote.state == "exited":
            self._finish(job, remote.exit_code)
        else:   # no Slurm job (any more): an ordinary held job
            with self.store.tx() as conn:
                jobrows.update(conn, job.id, node=None, gpu_indices=(), remote_pid=None,
                               remote_start=None)

    def _slurm_hold(self, job: Job, held: bool) -> None:
        """``scontrol hold``/``release`` of the job's pending Slurm job, on its node's worker."""
        from ..nodes import launcher

        def act() -> None:
            try:
                launcher.hold(self.pool, job.node or "", job.id, held)
            except IadeepError as exc:
                log.warning("%s job %s in Slurm failed: %s", "holding" if held else "releasing",
                            job.id, exc.message)
        self.actions.submit(job.node or "", ("hold" if held else "release", job.id), act)

    def _apply_remote(self, job: Job, remote) -> None:
        now = self.clock()
        if remote is not None and remote.state == "unknown":
            return   # nobody could look (its owner's sudo failed): nothing is known, or changed
        if remote is None or remote.state == "missing":
            if job.state == JobState.STARTING or (job.state == JobState.LOST
                                                  and job.remote_pid is None):
                self._not_started(job)   # the launch never happened
        elif remote.state == "claimed":
            if job.state != JobState.LOST:
                self._move(job, JobState.LOST, f"its launch on {job.node} was interrupted; "
                           "whether it started is unknown (check the node, then cancel it)")
        elif remote.state == "pending":
            # Slurm has it but has not started it: still `starting` (it holds its place on the
            # GPU iadeep chose), with Slurm's reason for `queue show/why`; running only once
            # squeue says RUNNING
            if job.state == JobState.STARTING and held_in_slurm(remote.reason):
                self._slurm_hold(job, False)   # iadeep says it should start (released)
            if job.state == JobState.STARTING:
                why = f"submitted to Slurm as job {remote.pid}; waiting for Slurm " \
                      f"({remote.reason or 'pending'})"
                if job.reason != why or job.remote_pid != remote.pid:
                    with self.store.tx() as conn:
                        jobrows.update(conn, job.id, reason=why, remote_pid=remote.pid)
        elif remote.state == "running":
            if job.state == JobState.SUSPENDED:
                return   # stopped on purpose; controller/adapt.py resumes it
            if job.state != JobState.RUNNING or job.remote_pid is None:
                why = "node answers again" if job.state == JobState.LOST else \
                    f"running on {job.node}:{','.join(map(str, job.gpu_indices))}" \
                    f"{self._run_dir(job)}"
                self._move(job, JobState.RUNNING, why, remote_pid=remote.pid,
                           remote_start=remote.start, started_at=job.started_at or now)
        else:  # exited
            self._finish(job, remote.exit_code)

    def _not_started(self, job: Job) -> None:
        """A launch that provably never started: cancelled if that was asked, else queued
        again without spending one of its retries."""
        if job.cancel_requested_by:
            self._move(job, JobState.CANCELLED, f"cancelled by {job.cancel_requested_by}"
                       " before it started", ended_at=self.clock())
            return
        why = "launch did not happen; back in the queue"
        health = self._launch_health.get(job.node or "")
        if health is not None and health.until > self.clock():
            why = (f"launch on {job.node} failed ({health.reason}); back in the queue, "
                   f"{job.node} is skipped for {health.until - self.clock():.0f} s")
        self._move(job, JobState.QUEUED, why, node=None, gpu_indices=(),
                   attempts=max(0, job.attempts - 1))

    def _finish(self, job: Job, code: int | None) -> None:
        now = self.clock()
        if job.checkpoint_at is not None and self.adapt.checkpointed(job, code):
            return   # it checkpointed on its --checkpoint-signal: queued again
        if job.cancel_requested_by:
            new, why = _stopped(job)
        elif code == 0:
            new, why = JobState.SUCCEEDED, "exited with code 0"
        elif code is None:
            if self._requeue(job, f"its attempt on {job.node} ended without an exit code "
                                  "(killed, or the node rebooted)"):
                return
            new, why = JobState.FAILED, "ended without an exit code (killed or node rebooted)"
        else:
            why = self._open_failure(job, code) or f"exited with code {code}"
            if job.spec.retry_on_fail and self._requeue(job, why):
                return
            new = JobState.FAILED
        self._samples.pop(job.id, None)
        self._move(job, new, why, exit_code=code, ended_at=now, started_at=job.started_at or now)

    def _open_failure(self, job: Job, code: int) -> str | None:
        """Why a job whose --output/--error could not be opened failed: the shell's message,
        which the wrapper wrote to the job directory's log (read only for its exit code)."""
        from ..nodes import launcher

        if code != launcher.OPEN_FAILED or job.node is None or not (job.spec.output
                                                                     or job.spec.error):
            return None
        try:
            data = launcher.read_log(self.pool, job.node, job.id, 0, 4096, owner=job.owner).data
        except IadeepError:
            return None
        line = next((x for x in data.decode("utf-8", "replace").splitlines()
                     if x.startswith(launcher.OPEN_FAILED_LINE)), None)
        said = None if line is None else line[len(launcher.OPEN_FAILED_LINE):][:300]
        return said and f"could not open its output (exit code {code}): {said}"

    def _requeue(self, job: Job, why: str) -> bool:
        """Queue a job's next attempt, if it has retries left; its previous attempt must be
        known dead or fenced.  The old attempt's node is remembered (an orphan): its directory
        is set aside, and anything of it still running stopped, before a new attempt may start
        there (else the new launch would find the old pid file)."""
        if job.attempts - job.checkpoints > job.spec.retries:   # checkpoints spend no retry
            return False
        if job.state != JobState.LOST:
            job = self._move(job, JobState.LOST, why)
        self._move(job, JobState.QUEUED, f"{why}; requeued (attempt {job.attempts + 1} of "
                   f"{job.spec.retries + 1} next)", node=None, gpu_indices=(), remote_pid=None,
                   remote_start=None, started_at=None, signalled=False,
                   orphans=job.orphans_with(job.node), suspended_at=None, suspended_for=None,
                   suspended_s=None)
        self._samples.pop(job.id, None)
        return True

    # ------------------------------------------------------------------ node loss
    def _lose_silent_nodes(self, now: float) -> None:
        """Jobs on nodes silent past the grace period, or no longer in the inventory, are lost.
        They are not requeued here: their attempt may still run (see the module docstring)."""
        with self.store.tx() as conn:
            silent = {n.name for n, since in cluster.load_nodes(conn)
                      if since is not None and now - since >= self.inventory.node_grace_s}
        known = {n.name for n in self.inventory.nodes}
        for job in self._jobs(ACTIVE):
            if job.node in silent:
                self._lose(job, f"node {job.node} silent for over "
                                f"{self.inventory.node_grace_s:.0f}s; it is requeued when the "
                                f"node answers and its attempt is gone, or when an admin runs "
                                f"`iadeep nodes fence {job.node}`")
            elif job.node not in known:
                self._lose(job, f"node {job.node} is no longer in the inventory")

    def _lose(self, job: Job, why: str) -> None:
        lost = self._move(job, JobState.LOST, why)
        if lost.cancel_requested_by:
            new, why = _stopped(lost)
            self._move(lost, new, f"{why}, while its node was lost",
                       ended_at=self.clock(), orphans=lost.orphans_with(lost.node))

    def fence(self, node: str, by: str) -> list[int]:
        """An admin declares every attempt on ``node`` dead (powered off, gone for good): its
        lost and active jobs are requeued if they have retries left, else failed. Should the
        node come back, those attempts are stopped before anything else starts there."""
        moved = []
        for job in self._jobs(ACTIVE | {JobState.LOST}, node):
            why = f"node {node} fenced by {by}"
            if not self._requeue(job, why):
                self._move(job, JobState.FAILED, f"{why}; no retries left", ended_at=self.clock(),
                           orphans=job.orphans_with(node))
            moved.append(job.id)
        return moved

    def _clean_orphans(self, node: str) -> None:
        """Stop abandoned attempts on a node that answers again (a requeued or cancelled job's
        old process), and set their directories aside so a new attempt there starts fresh."""
        with self.store.tx() as conn:
            jobs = [j for j in jobrows.with_orphans(conn) if node in j.orphans]
        for job in jobs:
            self.actions.submit(node, ("orphan", job.id, node),
                                partial(self._stop_orphan, node, job.id, job.owner))

    def _stop_orphan(self, node: str, job_id: int, owner: str) -> None:
        from ..nodes import launcher

        try:
            launcher.cancel(self.pool, node, job_id, grace_s=5, owner=owner)
            launcher.set_aside(self.pool, node, job_id, "abandoned", owner=owner)
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

    def _clean_old_dirs(self, snapshot: ClusterSnapshot, now: float) -> None:
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
        from ..nodes import launcher

        try:
            # One batch per owner: on a run_as: submitter node each owner's are theirs to remove.
            batches = ({"": ids} if not self.pool.node(node).submitter else
                       {o: [i for i in ids if owners[i] == o]
                        for o in sorted(set(owners.values()))})
            for owner, mine in batches.items():
                for start in range(0, len(mine), 200):   # bounded command lines
                    launcher.clean_finished(self.pool, node, mine[start:start + 200],
                                            owner=owner or None)
        except IadeepError as exc:
            log.warning("cleaning old job directories on %s: %s", node, exc.message)
            return
        with self.store.tx() as conn:
            done = cluster.get_meta(conn, "dirs_cleaned_until", {})
            cluster.set_meta(conn, "dirs_cleaned_until", {**done, node: until})
        if ids:
            log.info("removed %d finished jobs' directories on %s", len(ids), node)

    # ------------------------------------------------------------------ cancel
    def _stop_overdue(self, now: float) -> None:
        """Ask to stop each running job that has run past its time limit (``--time``, counted
        from this attempt's start). It is then stopped like a cancelled job (TERM, KILL after
        ``lab.kill_grace``) and recorded as ``timeout``, saying why. A job that asked for a
        ``--signal`` gets it first, its lead time before the limit (at most once an attempt:
        it is marked sent before it is sent)."""
        for job in self._jobs({JobState.RUNNING}):
            limit, began = job.spec.time_limit_s, job.started_at
            if limit is None or began is None or job.cancel_requested_by or job.node is None:
                continue
            began += job.suspended_s   # time suspended (controller/adapt.py) is not counted
            if job.spec.signal and not job.signalled:
                name, lead = parse_signal(job.spec.signal)
                if now - began >= limit - lead:
                    with self.store.tx() as conn:
                        jobrows.update(conn, job.id, signalled=True)
                    self.actions.submit(job.node, ("signal", job.id),
                                        partial(self._signal, job.node, job.id, name,
                                                job.owner))
            if now - began < limit:
                continue
            log.info("job %d (%s/%s) reached its time limit %s; stopping it", job.id, job.owner,
                     job.name, hms(limit))
            with self.store.tx() as conn:
                jobrows.update(conn, job.id, cancel_requested_by=TIME_LIMIT,
                               reason=f"time limit {hms(limit)} reached; stopping it")

    def _signal(self, node: str, job_id: int, name: str, owner: str) -> None:
        from ..nodes import launcher

        try:
            sent = launcher.signal(self.pool, node, job_id, name, owner=owner)
            log.info("job %d: SIG%s before its time limit%s", job_id, name,
                     "" if sent else " not sent: nothing of it runs")
        except IadeepError as exc:
            log.warning("signalling job %s on %s failed: %s", job_id, node, exc.message)

    def _cancel_requested(self, snapshot: ClusterSnapshot) -> None:
        """Stop cancelled jobs on their node's worker; the poll then sees them exit (a held job
        with a node is one Slurm keeps pending and held: its Slurm job is cancelled too).

        A stop is sent again only once a poll that began after the last one ended has been
        reconciled and still shows the job: sending it every round would, when a stop takes
        longer than the gap between polls (a loaded node), end each one after the next poll
        began, and reconcile (which waits for a poll newer than the job's last action) would
        never see the job exit."""
        polled = {node.name: node.taken_at for node in snapshot.nodes if node.reached}
        for job in self._jobs(ACTIVE | {JobState.HELD}):
            if not job.cancel_requested_by or job.node is None:
                continue
            if self.actions.acted_at(job.id) >= polled.get(job.node, float("inf")):
                continue   # its last action is newer than this poll: the next poll tells
            self.actions.submit(job.node, ("cancel", job.id),
                                partial(self._stop, job.node, job.id, job.owner))

    def _stop(self, node: str, job_id: int, owner: str) -> None:
        from ..nodes import launcher

        try:
            launcher.cancel(self.pool, node, job_id, grace_s=self.inventory.kill_grace_s,
                            owner=owner)
        except IadeepError as exc:
            log.warning("cancel of job %s on %s failed: %s", job_id, node, exc.message)

    # ------------------------------------------------------------------ profiling
    def _profile_new_workloads(self, snapshot: ClusterSnapshot,
                               known: dict[str, Profile]) -> dict[str, Profile]:
        """Sample the GPU of each running job without a profile while it runs alone; after
        PROFILE_SAMPLES polls record its profile, so later jobs of the kind can share.
        Returns the profiles recorded this round."""
        recorded: dict[str, Profile] = {}
        for job in self._jobs({JobState.RUNNING}):
            if job.spec.workload in known or len(job.gpu_indices) != 1:
                continue
            sample = _alone_on_gpu(job, snapshot)
            if sample is None:
                continue
            samples = self._samples.setdefault(job.id, [])
            samples.append(sample)
            profile = self._record_profile(job, samples) if len(samples) >= PROFILE_SAMPLES \
                else None
            if profile is not None:
                recorded[profile.workload] = profile
        return recorded

    def _record_profile(self, job: Job, samples: list[tuple[GpuSample, float | None]]
                        ) -> Profile | None:
        from ..model.online import profile_from_samples

        label = job.spec.workload or Path(job.spec.script).stem
        peak_gib = max((mem or 0.0) for _, mem in samples) / 1024.0
        try:
            sample = profile_from_samples(label, samples[0][0].name, [g for g, _ in samples],
                                          peak_gib, solo_it_per_s=self.observer.solo_rate(job.id))
        except IadeepError as exc:
            log.warning("profiling job %s: %s", job.id, exc.message)
            return None
        with self.store.tx() as conn:   # one job's sample never simply replaces a profile
            profile, verdict = profrows.learn(conn, sample, job_id=job.id, owner=job.owner,
                                              now=self.clock(),
                                              shipped=shipped_profiles().get(label))
            jobrows.update(conn, job.id, workload=label)
        self._samples.pop(job.id, None)
        log.log(logging.INFO if profile else logging.WARNING, "profile %r, sample of job %s "
                "(%s): %s", label, job.id, job.owner, verdict)
        return profile

    # ------------------------------------------------------------------ online learning
    def _observe_speeds(self, snapshot: ClusterSnapshot, now: float,
                        profiles: dict[str, Profile], lab: dict[str, Profile]
                        ) -> dict[int, float]:
        # Solo rates only of workloads this lab profiled itself (the shipped ones are other
        # programs with other batch sizes).
        known_solo = {name: p.solo_it_per_s for name, p in lab.items() if p.solo_it_per_s}
        known_util = {name: p.gpu_util for name, p in profiles.items() if p.gpu_util}
        answered = {n.name for n in snapshot.nodes if n.reached}
        running = [j for j in self._jobs({JobState.RUNNING}) if j.node in answered]
        self.observer.window_s = self.inventory.policy.adapt.window_s
        speeds, pairs = self.observer.observe(running, snapshot, now, known_solo, known_util)
        with self.store.tx() as conn:
            for job_id, speed in speeds.items():
                jobrows.update(conn, job_id, observed_speed=round(speed, 4))
            for pair in pairs:
                profrows.add_colocation(conn, pair, now)
            # the impact factor's accounting: work at these speeds, busy time, power
            impact.tick(conn, self.clock(), speeds, impact.power_of(snapshot))
        self._new_pairs += len(pairs)
        if self._new_pairs and now - self._last_fit >= REFIT_INTERVAL_S:
            log.info("refitting the model with %d new co-location measurements", self._new_pairs)
            self._new_pairs, self._last_fit = 0, now
            self._refit()
        return speeds

    # ------------------------------------------------------------------ schedule
    def _schedule(self, snapshot: ClusterSnapshot, profiles: dict[str, Profile]) -> None:
        from ..scheduler.placement import CautiousModel, GpuSlot, Plan, plan, slots_from_snapshot

        queue, waits = self._dependencies_met(self._jobs({JobState.QUEUED}))
        if not queue:
            with self.store.tx() as conn:
                jobrows.set_reasons(conn, list(waits.items()))
            return
        active = self._jobs(ACTIVE)
        snapshot = self._without_failing_nodes(snapshot)
        now = self.clock()
        fair = self.fairshare.points(self.store, self.inventory.policy, now)
        inventory = self.tuning.applied(self.inventory)   # with self-tuned settings, if any
        closed = self.adapt.closed(now)
        speeds: dict[tuple[str, ...], ModelSpeeds | None] = {}   # per set of GPU models

        def decide(jobs: list[Job], slots: Sequence[GpuSlot], residents: list[Job]) -> Plan:
            """plan() as this round asks it, also for the opportunistic jobs' trial: the same
            cautious reading of the predictor as `iadeep sim`'s iadeep policy, the same
            fair-share points, the same GPUs closed to partners and the same speeds per GPU
            model (read once a round)."""
            models = tuple(dict.fromkeys(s.gpu_model for s in slots))
            if models not in speeds:
                speeds[models] = self._model_speeds(models)
            return plan(jobs, slots, residents, profiles, CautiousModel(self.model),
                        inventory.policy, self.inventory.user_limits, now,
                        fairshare=fair, closed=closed, speeds=speeds[models],
                        durations=durations)

        durations = self._run_times(now)

        if self.adapt.make_room(queue, active, snapshot, profiles, decide):   # opportunists
            active = self._jobs(ACTIVE)                                          # yielded
        slots = slots_from_snapshot(snapshot, active, inventory, profiles)
        decided = decide(queue, slots, self.adapt.residents(active))
        waits.update(self._with_skipped_nodes(decided.waits))
        by_id = {j.id: j for j in queue}
        for placement in decided.placements:
            job = by_id[placement.job_id]
            if placement.node in job.orphans:
                waits[job.id] = f"waits for node {placement.node} to stop its lost attempt"
                continue
            try:
                self._start(job, placement)
            except InvalidTransition:   # held or cancelled since the plan was made
                waits.pop(job.id, None)
        with self.store.tx() as conn:
            jobrows.set_reasons(conn, list(waits.items()))

    def _run_times(self, now: float) -> Durations:
        """The lab's recent run times per workload label, for placement (re-read every
        ``RUN_TIMES_REFRESH_S``)."""
        if self._durations is None or now - self._durations[0] >= RUN_TIMES_REFRESH_S:
            with self.store.tx() as conn:
                runs = jobrows.run_times(conn, now - RUN_TIMES_WINDOW_S)
            self._durations = (now, Durations(runs))
        return self._durations[1]

    def _model_speeds(self, models: tuple[str, ...]) -> ModelSpeeds | None:
        """Each workload's solo speed per GPU model (scheduler/gpumodels.py), from every
        profile known, shipped and the lab's of every model, when the round's GPUs are of more
        than one model (``models``, in slot order); None otherwise (plan() then decides as on
        one model)."""
        if len(models) < 2:
            return None
        with self.store.tx() as conn:
            lab = [p for p, _source, _at in profrows.load_profiles(conn)]
        return model_speeds([*shipped_profiles().values(), *lab], models)

    def _dependencies_met(self, queue: list[Job]) -> tuple[list[Job], dict[int, str]]:
        """The queued jobs whose dependencies are met (only these go to ``plan()``), and why
        each other one waits. A job whose dependencies can never be met is cancelled, saying
        which one (``scheduler.depends``). Queued jobs come oldest first and a job can only
        depend on older ones, so a chain whose head failed is cancelled in one round."""
        from ..scheduler import depends

        needed = {dep for job in queue for _, dep in dependencies(job.spec)}
        if not needed:
            return queue, {}
        with self.store.tx() as conn:
            states = jobrows.states(conn, needed)
        ready, waits = [], {}
        for job in queue:
            waiting, never = depends.check(job.spec, states)
            if never is not None:
                try:
                    self._move(job, JobState.CANCELLED, never, ended_at=self.clock())
                except InvalidTransition:   # held or cancelled by its owner meanwhile
                    continue
                if job.id in states:
                    states[job.id] = JobState.CANCELLED
            elif waiting is not None:
                waits[job.id] = waiting
            else:
                ready.append(job)
        return ready, waits

    def _without_failing_nodes(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """Nodes whose launches keep failing (full disk, broken workdir) offer no GPUs until
        their back-off ends, so jobs go to the other nodes instead of looping on one."""
        now = self.clock()
        failing = {n: h for n, h in self._launch_health.items() if h.until > now}
        if not failing:
            return snapshot
        return dataclasses.replace(snapshot, nodes=tuple(
            dataclasses.replace(n, error=f"launches failing: {failing[n.name].reason}")
            if n.name in failing else n for n in snapshot.nodes))

    def _with_skipped_nodes(self, waits: dict[int, str]) -> dict[int, str]:
        """Waiting reasons that name the nodes skipped because their launches fail (sudo
        refusing, a broken workdir), why, and when they are tried again: plan() saw those nodes
        only as offering no GPUs, which reads like nodes that are down."""
        now = self.clock()
        skipped = "; ".join(
            f"node {n} is skipped until {clock(h.until)} (in {h.until - now:.0f} s): its last "
            f"launch failed: {h.reason}" for n, h in sorted(self._launch_health.items())
            if h.until > now)
        if not skipped:
            return waits
        return {i: skipped if why.startswith("no GPUs available") else f"{why}; {skipped}"
                for i, why in waits.items()}

    def _start(self, job: Job, placement) -> None:
        """Record the placement (committed before anything happens on the node), then launch
        on the node's worker; the round goes on without waiting for it."""
        speeds = placement.predicted_speeds
        why = f"; {placement.note}" if placement.note else ""   # the GPU model decided
        started = self._move(job, JobState.STARTING, f"placed on {placement.node}:"
                             f"{','.join(map(str, placement.gpu_indices))}{why}",
                             node=placement.node, gpu_indices=placement.gpu_indices,
                             attempts=job.attempts + 1, predicted_speed=speeds.get(job.id),
                             remote_pid=None, remote_start=None)
        with self.store.tx() as conn:
            for other, speed in speeds.items():
                if other != job.id:
                    jobrows.update(conn, other, predicted_speed=speed)
        self.actions.submit(placement.node, ("launch", job.id),
                            lambda: self._launch(started, placement))

    def _run_dir(self, job: Job) -> str:
        """Where the job runs on its node and why (--chdir, the shared submission directory,
        or its job directory), for `queue why`: '' or a part that starts with a space."""
        if not (job.spec.workdir or job.spec.submit_dir):
            return ""   # submitted through the API without either: as always
        node = self.inventory.node(job.node or "")
        return " " + run_dir_note(job.spec, job.node or "", node.shared_paths if node else ())

    def _launch(self, started: Job, placement) -> None:
        from ..nodes import launcher

        node = placement.node
        try:
            result = launcher.launch(self.pool, node, started, placement.gpu_indices,
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
            self._move(started, JobState.FAILED, f"could not launch: {exc.message}",
                       ended_at=self.clock())
            return
        if node in self._launch_health:
            log.info("node %s launches jobs again", node)
            self._launch_health.pop(node, None)
        if result.waiting:   # Slurm: the poll says when it runs (see _apply_remote)
            with self.store.tx() as conn:
                held = jobrows.get(conn, started.id).state == JobState.HELD   # meanwhile
                jobrows.update(conn, started.id, remote_pid=result.pid, **({} if held else {
                    "reason": f"submitted to Slurm as job {result.pid}; waiting for Slurm to "
                              "start it"}))
            return
        try:
            model = f"; {placement.note}" if placement.note else ""   # why this GPU model
            self._move(started, JobState.RUNNING, f"running on {node}:"
                       f"{','.join(map(str, placement.gpu_indices))}{self._run_dir(started)}"
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
            self._move(started, JobState.FAILED, f"could not launch: {exc.message}",
                       ended_at=self.clock())
            return
        skipped = self._launch_failed(node, exc.message)
        log.warning("launch of job %s on %s refused: %s; %s is skipped for %.0f s",
                    started.id, node, exc.message, node, skipped)
        self._not_started(started)

    def _owner_files_failed(self, started: Job, node: str, exc: OwnerFilesError) -> None:
        """The owner's home on ``node`` took neither the job's directory nor its script (full,
        not writable): nothing of it ran. That counts against this owner's job, not the node
        (which stays in use for everyone else): the job is held with the reason, for its
        owner to see in `queue why` and release once the home is fixed."""
        log.warning("job %s of %s held: %s", started.id, started.owner, exc.message)
        if started.cancel_requested_by:
            self._not_started(started)
            return
        now = self.clock()
        with self.store.tx() as conn:
            jobrows.transition(conn, started.id, JobState.QUEUED, "launch did not happen",
                               ACTOR, now, node=None, gpu_indices=(),
                               attempts=max(0, started.attempts - 1))
            jobrows.transition(conn, started.id, JobState.HELD,
                               f"{exc.message} (hint: {exc.hint})", ACTOR, now)

    def _launch_failed(self, node: str, reason: str) -> float:
        """A launch on ``node`` failed or was refused node-wide: back off; the seconds it is
        skipped."""
        return self._launch_health.setdefault(node, _LaunchHealth()).failed(reason, self.clock())

    def launch_health(self) -> dict[str, dict]:
        """Nodes skipped because their launches fail: node -> {reason, until}."""
        now = self.clock()
        return {n: {"reason": h.reason, "until": h.until}
                for n, h in self._launch_health.items() if h.until > now}

    def script_copy(self, job: Job) -> Path:
        """The copy of the script taken when the job was submitted (later edits don't leak);
        an array's tasks share the one copy kept under the array's id."""
        return self.scripts_dir / str(job.array_id or job.id) / Path(job.spec.script).name


def _stopped(job: Job) -> tuple[JobState, str]:
    """The end of a job that was asked to stop: cancelled by a person, or timed out."""
    if job.cancel_requested_by == TIME_LIMIT:
        return JobState.TIMEOUT, f"time limit {hms(job.spec.time_limit_s)} reached"
    return JobState.CANCELLED, f"cancelled by {job.cancel_requested_by}"


def _alone_on_gpu(job: Job, snapshot: ClusterSnapshot) -> tuple[GpuSample, float | None] | None:
    """(its GPU's sample, the job's memory in MiB) if the job is the only iadeep job on its
    GPU in this snapshot, else None (a profile must describe the job running alone)."""
    gpu = snapshot.gpu(job.node, job.gpu_indices[0])
    if gpu is None or any(p.job_id not in (None, job.id) for p in gpu.processes):
        return None
    mine = [p.used_memory_mib for p in gpu.processes if p.job_id == job.id]
    known = [m for m in mine if m is not None]
    return gpu, (max(known) if mine and len(known) == len(mine) else gpu.memory_used_mib)


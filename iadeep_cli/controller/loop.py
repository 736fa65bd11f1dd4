"""One scheduling round: poll -> record -> reconcile -> lose -> cancel -> profile -> schedule.

Why this order: the truth on the nodes (reconcile) is established before anything is decided,
so a restarted controller never starts a job that is already running. A launch is recorded as
``starting`` (with node and GPUs) and committed *before* the job is started on the node; if the
controller dies in between, the next round's reconcile finds either the job's pid file (it did
start: running) or nothing (it did not: queued again). A job is therefore never started twice.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

from ..errors import IadeepError, InvalidTransition, NodeError
from ..inventory import Inventory
from ..jobs import ACTIVE, Job, JobState, with_orphan, without_orphan
from ..model.profiles import Profile, shipped_profiles
from ..snapshot import ClusterSnapshot, GpuSample
from ..store import Store, cluster, jobs as jobrows, profiles as profrows

log = logging.getLogger("iadeep.controller")
ACTOR = "controller"
PROFILE_SAMPLES = 6   # polls of a job alone on its GPU before its profile is recorded
REFIT_INTERVAL_S = 3600.0   # refit the model at most this often, when new pairs were observed


class SchedulingLoop:
    def __init__(self, store: Store, inventory: Inventory, pool, scripts_dir: Path,
                 clock: Callable[[], float] = time.time, fit_in_background: bool = True):
        from ..model.predictor import analytic_model
        from .observe import SpeedObserver

        self.store, self.inventory, self.pool = store, inventory, pool
        self.scripts_dir = scripts_dir
        self.clock = clock
        self.model = analytic_model()   # conservative until the fitted model is ready
        self._samples: dict[int, list[tuple[GpuSample, float | None]]] = {}
        self.observer = SpeedObserver(pool)
        self._fit_in_background = fit_in_background
        self._last_fit = clock()
        self._new_pairs = 0
        self._refit()

    def _refit(self) -> None:
        if self._fit_in_background:
            threading.Thread(target=self._fit, name="iadeep-fit", daemon=True).start()
        else:
            self._fit()

    # ------------------------------------------------------------------ model
    def lab_profiles(self) -> dict[str, Profile]:
        """Profiles measured in this lab (they override the shipped ones of the same name)."""
        with self.store.tx() as conn:
            return {p.workload: p for p, _source, _at in profrows.load_profiles(conn)}

    def _fit(self) -> None:
        from ..model.catalog import lab_measurements
        from ..model.predictor import fit_model
        from ..model.profiles import shipped_pairs, shipped_profiles

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
        snapshot = self.pool.poll_all()
        with self.store.tx() as conn:
            cluster.save_nodes(conn, snapshot.nodes)
            cluster.forget_nodes(conn, {n.name for n in self.inventory.nodes})
        for node in snapshot.nodes:
            if node.ok:
                self._reconcile(node.name)
        self._lose_silent_nodes(now)
        self._cancel_requested()
        shipped, lab = shipped_profiles(), self.lab_profiles()
        lab.update(self._profile_new_workloads(snapshot, {**shipped, **lab}))
        profiles = {**shipped, **lab}
        self._observe_speeds(snapshot, now, profiles, lab)
        self._schedule(snapshot, profiles)

    def close(self) -> None:
        self.pool.close()

    # ------------------------------------------------------------------ helpers
    def _move(self, job: Job, new: JobState, reason: str, **fields) -> Job:
        with self.store.tx() as conn:
            return jobrows.transition(conn, job.id, new, reason, ACTOR, self.clock(), **fields)

    def _jobs(self, states, node: str | None = None) -> list[Job]:
        with self.store.tx() as conn:
            return jobrows.select(conn, states=states, node=node)

    # ------------------------------------------------------------------ reconcile
    def _reconcile(self, node: str) -> None:
        """Bring every job we think is on ``node`` in line with what the node says."""
        from ..nodes import launcher

        self._clean_orphans(node)
        jobs = self._jobs(ACTIVE | {JobState.LOST}, node)
        if not jobs:
            return
        try:
            remote = launcher.reconcile(self.pool, node, [j.id for j in jobs])
        except IadeepError as exc:
            log.warning("reconcile on %s failed: %s", node, exc.message)
            return
        for job in jobs:
            self._apply_remote(job, remote.get(job.id))

    def _apply_remote(self, job: Job, remote) -> None:
        now = self.clock()
        if remote is None or remote.state == "missing":
            if job.state == JobState.STARTING:   # the launch never happened
                self._not_started(job)
            elif job.state == JobState.RUNNING:
                # Its process may live on without its directory: never start it elsewhere.
                self._lose(job, f"its directory vanished from node {job.node}", requeue=False)
        elif remote.state == "claimed":
            if job.state != JobState.LOST:
                self._lose(job, f"its launch on {job.node} was interrupted; whether it started "
                                "is unknown (check the node, then cancel it)", requeue=False)
        elif remote.state == "running":
            if job.state != JobState.RUNNING:
                why = "node answers again" if job.state == JobState.LOST else "running"
                self._move(job, JobState.RUNNING, why, remote_pid=remote.pid,
                           started_at=job.started_at or now)
        else:  # exited
            self._finish(job, remote.exit_code)

    def _not_started(self, job: Job) -> None:
        """A launch that provably never started: cancelled if that was asked, else queued
        again without spending one of its retries."""
        if job.extra.get("cancel_requested_by"):
            self._move(job, JobState.CANCELLED, f"cancelled by {job.extra['cancel_requested_by']}"
                       " before it started", ended_at=self.clock())
        else:
            self._move(job, JobState.QUEUED, "launch did not happen; back in the queue",
                       node=None, gpu_indices=(), attempts=max(0, job.attempts - 1))

    def _finish(self, job: Job, code: int | None) -> None:
        now = self.clock()
        if job.extra.get("cancel_requested_by"):
            new, why = JobState.CANCELLED, f"cancelled by {job.extra['cancel_requested_by']}"
        elif code == 0:
            new, why = JobState.SUCCEEDED, "exited with code 0"
        elif code is None:
            new, why = JobState.FAILED, "ended without an exit code (killed or node rebooted)"
        else:
            new, why = JobState.FAILED, f"exited with code {code}"
        self._samples.pop(job.id, None)
        self._move(job, new, why, exit_code=code, ended_at=now, started_at=job.started_at or now)

    # ------------------------------------------------------------------ node loss
    def _lose_silent_nodes(self, now: float) -> None:
        """Jobs on nodes silent past the grace period, or no longer in the inventory, are lost."""
        with self.store.tx() as conn:
            silent = {n.name for n, since in cluster.load_nodes(conn)
                      if since is not None and now - since >= self.inventory.node_grace_s}
        known = {n.name for n in self.inventory.nodes}
        for job in self._jobs(ACTIVE):
            if job.node in silent:
                self._lose(job, f"node {job.node} silent for over "
                                f"{self.inventory.node_grace_s:.0f}s")
            elif job.node not in known:
                self._lose(job, f"node {job.node} is no longer in the inventory", requeue=False)

    def _lose(self, job: Job, why: str, requeue: bool = True) -> None:
        """Mark a job lost; requeue it if it allows retries and its old attempt can be stopped
        later (its node is remembered as holding an orphan until then)."""
        lost = self._move(job, JobState.LOST, why)
        if lost.extra.get("cancel_requested_by"):
            self._move(lost, JobState.CANCELLED, "cancelled while its node was lost",
                       ended_at=self.clock(), extra=with_orphan(lost.extra, lost.node))
        elif requeue and lost.attempts <= lost.spec.retries:
            self._move(lost, JobState.QUEUED, f"requeued after loss (attempt {lost.attempts} "
                       f"of {lost.spec.retries + 1})", node=None, gpu_indices=(),
                       extra=with_orphan(lost.extra, lost.node))

    def _clean_orphans(self, node: str) -> None:
        """Stop abandoned attempts on a node that answers again (a requeued or cancelled job's
        old process), and set their directories aside so a new attempt there starts fresh."""
        from ..nodes import launcher

        with self.store.tx() as conn:
            jobs = jobrows.with_extra(conn, "orphans")
        for job in jobs:
            if node not in job.extra["orphans"]:
                continue
            try:
                launcher.cancel(self.pool, node, job.id, grace_s=5)
                launcher.set_aside(self.pool, node, job.id, "abandoned")
            except IadeepError as exc:
                log.warning("stopping old attempt of job %s on %s: %s", job.id, node, exc.message)
                continue
            with self.store.tx() as conn:   # re-read: the job may have moved meanwhile
                fresh = jobrows.get(conn, job.id)
                jobrows.update(conn, job.id, extra=without_orphan(fresh.extra, node))
            log.info("stopped the abandoned attempt of job %s on %s", job.id, node)

    # ------------------------------------------------------------------ cancel
    def _cancel_requested(self) -> None:
        from ..nodes import launcher

        for job in self._jobs(ACTIVE):
            if not job.extra.get("cancel_requested_by"):
                continue
            try:
                launcher.cancel(self.pool, job.node, job.id)
            except IadeepError as exc:
                log.warning("cancel of job %s on %s failed: %s", job.id, job.node, exc.message)
                continue
            self._reconcile(job.node)

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
                        profiles: dict[str, Profile], lab: dict[str, Profile]) -> None:
        # Solo rates only of workloads this lab profiled itself (the shipped ones are other
        # programs with other batch sizes).
        known_solo = {name: p.solo_it_per_s for name, p in lab.items() if p.solo_it_per_s}
        known_util = {name: p.gpu_util for name, p in profiles.items() if p.gpu_util}
        speeds, pairs = self.observer.observe(self._jobs({JobState.RUNNING}), snapshot, now,
                                              known_solo, known_util)
        with self.store.tx() as conn:
            for job_id, speed in speeds.items():
                jobrows.update(conn, job_id, observed_speed=round(speed, 4))
            for pair in pairs:
                profrows.add_colocation(conn, pair, now)
        self._new_pairs += len(pairs)
        if self._new_pairs and now - self._last_fit >= REFIT_INTERVAL_S:
            log.info("refitting the model with %d new co-location measurements", self._new_pairs)
            self._new_pairs, self._last_fit = 0, now
            self._refit()

    # ------------------------------------------------------------------ schedule
    def _schedule(self, snapshot: ClusterSnapshot, profiles: dict[str, Profile]) -> None:
        from ..scheduler.placement import plan, slots_from_snapshot

        queue = self._jobs({JobState.QUEUED})
        if not queue:
            return
        active = self._jobs(ACTIVE)
        slots = slots_from_snapshot(snapshot, active, self.inventory, profiles)
        decided = plan(queue, slots, active, profiles, self.model, self.inventory.policy,
                       self.inventory.user_limits, self.clock())
        waits = dict(decided.waits)
        by_id = {j.id: j for j in queue}
        for placement in decided.placements:
            job = by_id[placement.job_id]
            if placement.node in job.extra.get("orphans", ()):
                waits[job.id] = f"waits for node {placement.node} to stop its lost attempt"
                continue
            try:
                self._start(job, placement)
            except InvalidTransition:   # held or cancelled since the plan was made
                waits.pop(job.id, None)
        with self.store.tx() as conn:
            jobrows.set_reasons(conn, list(waits.items()))

    def _start(self, job: Job, placement) -> None:
        from ..nodes import launcher

        speeds = placement.predicted_speeds
        started = self._move(job, JobState.STARTING, f"placed on {placement.node}:"
                             f"{','.join(map(str, placement.gpu_indices))}",
                             node=placement.node, gpu_indices=placement.gpu_indices,
                             attempts=job.attempts + 1, predicted_speed=speeds.get(job.id))
        with self.store.tx() as conn:
            for other, speed in speeds.items():
                if other != job.id:
                    jobrows.update(conn, other, predicted_speed=speed)
        try:
            result = launcher.launch(self.pool, placement.node, started,
                                     placement.gpu_indices, self.script_copy(job))
        except NodeError as exc:
            # Unknown whether it started: the next round's reconcile finds out.
            log.warning("launch of job %s on %s: %s", job.id, placement.node, exc.message)
            return
        except IadeepError as exc:
            self._move(started, JobState.FAILED, f"could not launch: {exc.message}",
                       ended_at=self.clock())
            return
        self._move(started, JobState.RUNNING, f"running on {placement.node}:"
                   f"{','.join(map(str, placement.gpu_indices))}",
                   remote_pid=result.pid, started_at=self.clock())

    def script_copy(self, job: Job) -> Path:
        """The copy of the script taken when the job was submitted (later edits don't leak)."""
        return self.scripts_dir / str(job.id) / Path(job.spec.script).name


def _alone_on_gpu(job: Job, snapshot: ClusterSnapshot) -> tuple[GpuSample, float | None] | None:
    """(its GPU's sample, the job's memory in MiB) if the job is the only iadeep job on its
    GPU in this snapshot, else None (a profile must describe the job running alone)."""
    gpu = snapshot.gpu(job.node, job.gpu_indices[0])
    if gpu is None or any(p.job_id not in (None, job.id) for p in gpu.processes):
        return None
    mine = [p.used_memory_mib for p in gpu.processes if p.job_id == job.id]
    return gpu, (max(mine) if mine and None not in mine else gpu.memory_used_mib)


"""The requests the controller answers. Each one: check who asks, make one store change.

``OPERATIONS`` (at the end) is the protocol in one table: each request type (``messages``),
the handler that answers it, whether readers answer it themselves while the controller is
down (``offline``), and whether only admins may send it. ``handle`` dispatches by it, and so
does ``offline.read``: a new operation is one row there and its handler.

The caller's user name comes from the socket's peer credentials (``server``), never from the
request, so nobody can act as someone else. Owners act on their own jobs; admins listed in the
inventory (and root) on any.

Every argument is checked against its request field's annotation before the handler runs
(``messages.Request.from_dict``): a request from any local account is untrusted, and an
ill-typed one is the caller's mistake (InputError), never a controller bug.
"""
from __future__ import annotations

import base64
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import checks, messages as m
from ...errors import (
    IadeepError,
    InputError,
    InvalidTransition,
    NodeError,
    NotFoundError,
    PermissionDenied,
)
from ...jobopts import node_allowed, node_rules
from ...jobs import (
    ACTIVE,
    FINISHED,
    UNFINISHED,
    Job,
    JobSpec,
    JobState,
    StopReason,
    SubmitSpec,
    check_priority,
    checkpoint_signal_of,
    dependencies,
    parse_array,
    program_label,
    validate_spec,
)
from ...model.data import shipped_profiles
from ...nodes.backend import features
from ...paths import StateDir, replace_file
from ...settings import Inventory
from ...snapshot import NodeSnapshot
from ...store import Store, cluster, is_damage, jobrows, profiles as profrows, scripts
from ...text import MIB_PER_GIB, clock, duration, hms
from . import admission, drain, interactive, reservations, update, views
from .port import STANDALONE, ControllerPort, NodeWork

log = logging.getLogger("iadeep.controller")

if TYPE_CHECKING:   # the forecast (and placement with it) loads only with the loop
    from ...scheduler.forecast import JobForecast

MAX_SCRIPT_BYTES = 4 * 1024 * 1024
STREAMS = ("output", "error")


class Service(views.StoreReader):
    """The controller's answers to requests, built whole: the store, the lab, the clock, and
    the port to the controller around it (``port.ControllerPort``: wake the round, reload, the
    round's nodes for logs, keystrokes and fencing, and whether new jobs are refused now)."""

    def __init__(self, store: Store, inventory: Inventory, clock: Callable[[], float] = time.time,
                 port: ControllerPort = STANDALONE, scripts_dir: Path | None = None):
        super().__init__(store, clock, inventory)
        self.inventory: Inventory = inventory   # always one here (a StoreReader's may be None)
        self.scripts_dir = scripts_dir or StateDir(store.path.parent).scripts
        self.port = port

    def use(self, inventory: Inventory) -> None:
        """A reloaded inventory, from the next request on (``runtime.Controller.reload``)."""
        self.inventory = inventory

    def wake(self) -> None:
        """Start the next round now: a write changed what it would decide."""
        self.port.wake()

    def reload(self) -> m.ReloadResult:
        """Re-read the inventory file (``runtime.Controller.reload``)."""
        return self.port.reload()

    @property
    def degraded(self) -> IadeepError | None:
        """Why new jobs are refused now (the runtime's health check); None: they are not."""
        return self.port.degraded()

    # ------------------------------------------------------------------ forecasts on reads
    def jobs(self, all_states: bool, owner: str | None, last: int | None = None,
             before: int | None = None) -> list[m.JobView]:
        out = super().jobs(all_states, owner, last, before)
        foresight = self.port.forecasts()
        ahead = foresight.starts() if foresight is not None else {}
        if not ahead:
            return out
        return [_with_forecast(v, ahead.get(v.id)) for v in out]

    def job(self, job_id: int) -> m.JobDetail:
        detail = super().job(job_id)
        foresight = self.port.forecasts()
        if foresight is None or detail.job.state in FINISHED:
            return detail
        got = foresight.of(job_id)
        if got is None:
            return detail
        return dataclasses.replace(detail, forecast=got)

    # ------------------------------------------------------------------ dispatch
    def handle(self, op: str, args: dict[str, Any], user: str) -> Any:
        """Answer one request from ``user`` as JSON-able data (``server`` sends it)."""
        operation = OPERATIONS.get(op)
        if operation is None:
            raise InputError(f"unknown request {op[:40]!r}",
                             hint="client and controller versions differ?")
        request = operation.request.from_dict(args)
        if operation.admin_only and not self.inventory.is_admin(user):
            raise PermissionDenied(operation.admin_only.format(user=user),
                                   hint="ask a lab admin (lab.admins in nodes.yaml) or root")
        return m.encode(operation.handler(self, user, request))

    # ------------------------------------------------------------------ reads
    def reveal(self, user: str) -> views.Reveal:
        """Env values are shown to the job's owner and the admins only."""
        return lambda owner: owner == user or self.inventory.is_admin(user)

    def status(self) -> m.StatusView:
        try:
            view = super().status()
        except Exception as exc:
            damaged = self.store.check_damage() if is_damage(exc) else None
            if damaged is None:
                raise
            # Nothing recorded can be read: say what is wrong, and that it runs.
            now = self.clock()
            return m.StatusView(now=now, nodes=(), queue={}, controller=m.ControllerView(
                pid=os.getpid(), heartbeat_at=now, poll_interval_s=self.inventory.poll_interval_s,
                nodes=tuple(n.name for n in self.inventory.nodes), degraded=damaged))
        return dataclasses.replace(view, controller=dataclasses.replace(
            view.controller, degraded=self.degraded))

    # ------------------------------------------------------------------ writes
    def op_add(self, user: str, req: m.AddRequest) -> m.AddResult:
        """Queue a job. The script's content travels with the request and is kept with the
        job, like sbatch does: editing the file later does not change a queued job."""
        job_spec = self._admitted_spec(user, req.spec)
        if (req.spec.gave("notify") and job_spec.notify != "none"
                and not self.inventory.notify.reaches(user)):
            # Asked for, so said at once; the lab's default is applied without this check (a
            # user without an address must still be able to submit).
            raise InputError(f"--notify {job_spec.notify}: no notification channel of this lab "
                             f"reaches {user}",
                             hint="ask an admin to set lab.notify (smtp with address, or "
                                  "webhook) in the inventory, or leave --notify out")
        if req.token is not None:
            checks.text("token", req.token, max_len=128)
        content = _script_content(job_spec.script, req.script_b64)
        if job_spec.workload is None:   # labelled after its program (jobs.program_label)
            job_spec = dataclasses.replace(
                job_spec, workload=program_label(job_spec.script, content, user))
        indices = None if job_spec.array is None else parse_array(job_spec.array).indices
        with self.store.tx() as conn:
            self._check_runnable(conn, user, job_spec)
            job_spec = _with_dependencies(conn, job_spec)
            job_id, created = jobrows.insert(conn, user, job_spec, self.clock(), req.token)
            if created:  # written before COMMIT: an accepted job always has its script
                scripts.admit(conn, job_id, user, len(content), self.clock(),   # the quotas
                              self._copies_bytes())
                _write_script(self.scripts_dir / str(job_id), job_spec.script, content)
                if indices is not None:
                    self._add_tasks(conn, user, job_spec, job_id, indices)
        self.wake()
        return m.AddResult(job_id, created)

    def _admitted_spec(self, user: str, spec: SubmitSpec) -> JobSpec:
        """A submission's spec with the lab's defaults, checked as `queue add` checks it (and
        `--test-only`, so a dry run refuses what the real submission would)."""
        if self.degraded is not None:
            raise self.degraded
        job_spec = spec.resolve(retries=self.inventory.default_retries,
                                notify=self.inventory.notify.default)
        validate_spec(job_spec)
        admission.check_priority(self.inventory, user, job_spec.priority)
        admission.check_idle_after(self.inventory, user, job_spec.idle_after_s)
        return self._with_time_limit(job_spec)

    def op_test_only(self, user: str, req: m.TrialRequest) -> m.TrialResult:
        """``queue add --test-only``: the submission's checks, then plan() and the forecast
        over the queue as the last round had it with this job added; nothing is written."""
        job_spec = self._admitted_spec(user, req.spec)
        with self.store.read() as conn:
            self._check_runnable(conn, user, job_spec)
        if dependencies(job_spec):
            return m.TrialResult(False, "it would wait for its dependencies first (--after): "
                                 "no forecast before they are met")
        foresight = self.port.forecasts()
        if foresight is None:
            raise InputError("no forecast: this controller has no nodes to place jobs on",
                             hint="add nodes to the inventory (docs/administration.md)")
        got = foresight.trial(user, job_spec, self.clock())
        if got is None:
            raise InputError("no forecast yet: the controller has not finished a scheduling "
                             "round since it started", hint="try again in a few seconds")
        return got

    def _add_tasks(self, conn, user: str, spec: JobSpec, array_id: int,
                   indices: tuple[int, ...]) -> None:
        """The tasks of an array, in the submission's transaction (all of them or none): the
        first is the job already inserted, whose id is the array's; they share its script."""
        now = self.clock()
        jobrows.update(conn, array_id, array_id=array_id, array_index=indices[0])
        for index in indices[1:]:
            task, _ = jobrows.insert(conn, user, spec, now,
                                     reason=f"submitted (task {index} of array {array_id})")
            jobrows.update(conn, task, array_id=array_id, array_index=index)

    def op_rerun(self, user: str, req: m.RerunRequest) -> m.AddResult:
        """Submit a finished job again with the same spec, as a new job that names the old one
        (``rerun_of``). It belongs to the old job's owner (an admin's rerun runs as them, as
        the first run did). Its dependencies were decided for the first run and are dropped;
        an array's task stays a task of its array (same index, same script copy)."""
        if self.degraded is not None:
            raise self.degraded
        if req.token is not None:
            checks.text("token", req.token, max_len=128)
        with self.store.tx() as conn:
            old = self._owned(conn, user, req.id)
            if old.state not in FINISHED:
                raise InvalidTransition(f"job {old.id} is {old.state}; only a finished job can "
                                        "be run again", hint=f"wait for it to end, or `iadeep "
                                        f"queue cancel {old.id}` first")
            if old.spec.interactive:   # nobody would type into it
                raise InputError(f"job {old.id} was interactive (`iadeep run --pty`)",
                                 hint="start it again with `iadeep run --pty ...`")
            spec = dataclasses.replace(old.spec, after=(), after_any=(), after_fail=(),
                                       hold=False, begin_at=None)
            validate_spec(spec)
            admission.check_priority(self.inventory, user, spec.priority)
            admission.check_idle_after(self.inventory, user, spec.idle_after_s)
            self._check_runnable(conn, old.owner, spec)
            copy = self.scripts_dir / str(old.array_id or old.id) / Path(spec.script).name
            try:
                content = copy.read_bytes()
            except OSError:
                raise NotFoundError(f"job {old.id}'s copy of its script is gone ({copy})",
                                    hint="submit it again with `iadeep queue add`") from None
            if spec.workload is None:   # queued before labels named programs: as op_add
                spec = dataclasses.replace(
                    spec, workload=program_label(spec.script, content, old.owner))
            job_id, created = jobrows.insert(conn, old.owner, spec, self.clock(), req.token,
                                             reason=f"rerun of job {old.id} by {user}",
                                             actor=user)
            if created:
                jobrows.update(conn, job_id, rerun_of=old.id, array_id=old.array_id,
                               array_index=old.array_index)
                if old.array_id is None:
                    scripts.admit(conn, job_id, old.owner, len(content), self.clock(),
                                  self._copies_bytes())
                    _write_script(self.scripts_dir / str(job_id), spec.script, content)
        self.wake()
        return m.AddResult(job_id, created)

    def op_cancel(self, user: str, req: m.CancelRequest) -> list[m.JobActionResult]:
        return self._each(req, UNFINISHED, lambda conn, i: self._cancel_one(conn, user, i))

    def _cancel_one(self, conn, user: str, job_id: int) -> m.JobActionResult:
        job = self._owned(conn, user, job_id)
        if job.state in ACTIVE or (job.state == JobState.HELD and job.node is not None):
            # (a held job with a node: its backend has it pending and held, see op_hold)
            # The loop stops the process group on its node, then records 'cancelled'.
            jobrows.update(conn, job_id, cancel_requested_by=user,
                           stop_reason=StopReason.CANCELLED)
            self.wake()
            return m.JobActionResult(job_id, "cancelling")
        # A lost job may still run on its silent node: the loop stops it when it answers.
        orphans = job.orphans_with(job.node) if job.state == JobState.LOST else job.orphans
        jobrows.transition(conn, job_id, JobState.CANCELLED, f"cancelled by {user}", user,
                           self.clock(), ended_at=self.clock(), orphans=orphans)
        return m.JobActionResult(job_id, JobState.CANCELLED.value)

    def _with_time_limit(self, spec: JobSpec) -> JobSpec:
        """The lab's default time limit for a job that gives none (else its maximum, as a Slurm
        partition's MaxTime is its default); a longer one than the maximum is refused."""
        lab = self.inventory
        if spec.time_limit_s is None and spec.interactive:
            return dataclasses.replace(spec, time_limit_s=interactive.time_limit(
                lab.interactive_time_limit_s, lab.max_time_limit_s))
        if spec.time_limit_s is None:
            limit = lab.default_time_limit_s or lab.max_time_limit_s
            if limit is None and spec.signal is not None:
                raise InputError(f"--signal {spec.signal} is sent before the time limit, and "
                                 "this job has none", hint="add --time, e.g. --time 2:00:00")
            return spec if limit is None else dataclasses.replace(spec, time_limit_s=limit)
        if lab.max_time_limit_s is not None and spec.time_limit_s > lab.max_time_limit_s:
            raise InputError(f"--time {hms(spec.time_limit_s)} is longer than this lab allows "
                             f"({hms(lab.max_time_limit_s)})",
                             hint=f"ask for at most --time {hms(lab.max_time_limit_s)}, or ask "
                                  "an admin (lab.max_time_limit in nodes.yaml)")
        return spec

    def op_hold(self, user: str, req: m.HoldRequest) -> list[m.JobActionResult]:
        out = self._each(req, {JobState.QUEUED, JobState.STARTING},
                         lambda conn, i: self._hold_one(conn, user, i))
        self.wake()
        return out

    def _hold_one(self, conn, user: str, job_id: int) -> m.JobActionResult:
        """A queued job is held here; a `starting` one only on a node whose backend may keep
        it pending (``Features.keeps_jobs_pending``): it is committed `held` first, then the
        loop holds it there (``Backend.hold``), or finds it had started (docs/slurm.md)."""
        job = self._owned(conn, user, job_id)
        if job.state == JobState.STARTING:
            node = self.inventory.node(job.node or "")
            kind = features(node.backend) if node is not None else None
            if kind is None or not kind.keeps_jobs_pending:
                raise InvalidTransition(f"job {job_id} is starting; it cannot become held",
                                        hint="see `iadeep queue show ID` for its current state")
            return self._move(conn, user, job_id, JobState.HELD,
                              f"held by {user} (in {kind.label} too: {kind.hold_command})")
        return self._move(conn, user, job_id, JobState.HELD, f"held by {user}")

    def op_release(self, user: str, req: m.ReleaseRequest) -> list[m.JobActionResult]:
        out = self._each(req, {JobState.HELD}, lambda conn, i: self._release_one(conn, user, i))
        self.wake()
        return out

    def _release_one(self, conn, user: str, job_id: int) -> m.JobActionResult:
        """Back to the queue; a job its backend's queue holds goes back there, where it was
        placed (`starting`; the loop's ``Backend.release``)."""
        job = self._owned(conn, user, job_id)
        if job.state == JobState.HELD and job.node is not None:
            node = self.inventory.node(job.node)
            where = (f"{features(node.backend).label} ({features(node.backend).release_command})"
                     if node is not None else "its backend's queue")
            return self._move(conn, user, job_id, JobState.STARTING,
                              f"released by {user}; back to {where}")
        return self._move(conn, user, job_id, JobState.QUEUED, f"released by {user}")

    def op_requeue(self, user: str, req: m.RequeueRequest) -> list[m.JobActionResult]:
        out = self._each(req, {JobState.RUNNING},
                         lambda conn, i: self._requeue_one(conn, user, i))
        self.wake()
        return out

    def _requeue_one(self, conn, user: str, job_id: int) -> m.JobActionResult:
        """A running --requeue job: the intent is committed here (who asked, when); the loop
        sends its checkpoint signal once (``Adapter.preempt``) and requeues it when it exits
        or its grace ends, without spending a retry. Asking again changes nothing."""
        job = self._owned(conn, user, job_id)
        if job.state != JobState.RUNNING:
            raise InvalidTransition(f"job {job_id} is {job.state}; only a running job can be "
                                    "requeued", hint="`iadeep queue show ID` shows its state")
        if not job.spec.requeue:
            raise InputError(f"job {job_id} was not submitted with --requeue, so it may not "
                             "be able to resume from a checkpoint",
                             hint="cancel it, or submit it again with --requeue")
        if job.preempt_at is None and job.checkpoint_at is None:
            now = self.clock()
            signal = checkpoint_signal_of(job.spec)
            jobrows.update(conn, job_id, preempt_for=user, preempt_at=now)
            jobrows.add_event(conn, job_id, now, job.state, job.state,
                              f"requeue asked by {user}: SIG{signal} next round, requeued "
                              "when it exits", user)
        return m.JobActionResult(job_id, "requeueing")

    def _each(self, req: m.JobsRequest, applies: Iterable[JobState],
              act: Callable[[Any, int], m.JobActionResult]) -> list[m.JobActionResult]:
        """Act on every job the request names (``_targets``), in one transaction (an array's
        thousands of tasks in one commit); one failure (not yours, unknown id, wrong state)
        does not stop the others."""
        results = []
        with self.store.tx() as conn:
            for job_id, problem in _targets(conn, req, frozenset(applies)):
                try:
                    if problem is not None:
                        raise problem
                    results.append(act(conn, job_id))
                except IadeepError as exc:
                    results.append(m.JobActionResult(job_id, error=exc))
        return results

    def _move(self, conn, user: str, job_id: int, new: JobState, reason: str
              ) -> m.JobActionResult:
        self._owned(conn, user, job_id)
        job = jobrows.transition(conn, job_id, new, reason, user, self.clock())
        return m.JobActionResult(job.id, job.state.value)

    def op_priority(self, user: str, req: m.PriorityRequest) -> m.PriorityResult:
        """One job's priority; an array's id: every waiting or running task's (``index``: one
        task's)."""
        check_priority(req.priority)
        admission.check_priority(self.inventory, user, req.priority)
        with self.store.tx() as conn:
            tasks = jobrows.array_tasks(conn, req.id)
            if req.index is not None:
                jobs = [t for t in tasks if t.array_index == req.index][-1:]
                if not jobs:
                    raise NotFoundError(f"array {req.id} has no task {req.index}",
                                        hint=f"`iadeep queue show {req.id}` shows the array")
            else:
                jobs = [t for t in tasks if t.state not in FINISHED] or \
                    [jobrows.get(conn, req.id)]
            for job in jobs:
                self._owned(conn, user, job.id)
                if job.state in FINISHED:
                    raise InvalidTransition(f"job {job.id} is {job.state}; its priority no "
                                            "longer matters")
                jobrows.update(conn, job.id, priority=req.priority)
                jobrows.add_event(conn, job.id, self.clock(), job.state, job.state,
                                  f"priority {job.spec.priority} -> {req.priority} by {user}",
                                  user)
        self.wake()
        return m.PriorityResult(req.id, req.priority)

    def op_reload(self, user: str, req: m.ReloadRequest) -> m.ReloadResult:
        """Re-read the inventory file (runtime.Controller.reload)."""
        return self.reload()

    def _check_runnable(self, conn, user: str, spec: JobSpec) -> None:
        """Refuse a job that could never start here (it would wait forever): more GPUs than
        the user may use or than any node has, more memory than any GPU. What is known comes
        from the inventory (``gpus:`` lists, user limits) and each node's last snapshot; a
        node never seen could be any size, so nothing is refused on what it might hold."""
        limit = self.inventory.user_limits.get(user)
        if limit is not None and limit.max_gpus is not None and spec.gpus > limit.max_gpus:
            raise InputError(
                f"the job needs {spec.gpus} GPUs but {user} may use at most {limit.max_gpus} "
                "at once (lab.user_limits)", hint=f"ask for at most {limit.max_gpus} with "
                "--gpus, or ask a lab admin to raise your max_gpus in nodes.yaml")
        candidates = self._allowed_nodes(spec)
        admission.check_admitted(user, candidates)   # who may never run: refused now
        if spec.interactive:
            interactive.check_nodes(candidates)   # a terminal needs a node that can give one
        seen = {snap.name: snap for snap, _ in cluster.load_nodes(conn)}
        sizes = [_gpu_sizes(node.gpus, seen.get(node.name)) for node in candidates]
        nodes = [s for s in sizes if s is not None]
        if not nodes or len(nodes) < len(sizes):
            return
        need = (spec.mem_gib or 0.0) * MIB_PER_GIB
        if any(sum(1 for size in gpus if size is None or size >= need) >= spec.gpus
               for gpus in nodes):
            return
        most = max(len(gpus) for gpus in nodes)
        among = f" of those it may run on ({node_rules(spec)})" if node_rules(spec) else " here"
        if spec.gpus > most:
            raise InputError(
                f"the job needs {spec.gpus} GPUs on one node; the largest node{among} has {most}",
                hint=f"ask for at most {most} with --gpus (a job runs on one node), or add a "
                     "larger node to the inventory")
        largest = max(size for gpus in nodes for size in gpus if size is not None) / MIB_PER_GIB
        each = "" if spec.gpus == 1 else f" on each of {spec.gpus} GPUs of one node"
        raise InputError(
            f"the job needs {spec.mem_gib:g} GiB of GPU memory{each}; the largest GPU{among} has "
            f"{largest:.1f} GiB", hint="--gpu-mem is the memory one GPU of the job needs, in GiB")

    def _allowed_nodes(self, spec: JobSpec) -> list:
        """The inventory's nodes the job's --constraint/--nodelist/--exclude allow; refuses
        (at submission, with the reason) a rule no node could ever meet: a label no node has,
        a node name not in the inventory, or rules that together leave no node."""
        nodes = self.inventory.nodes
        if not (spec.constraint or spec.nodelist or spec.exclude):
            return list(nodes)
        names = {n.name for n in nodes}
        known = ", ".join(sorted(names)) or "none"
        for option, given in (("--nodelist", spec.nodelist), ("--exclude", spec.exclude)):
            unknown = [n for n in given if n not in names]
            if unknown:
                raise InputError(f"{option}: no node named {', '.join(unknown)} in this lab",
                                 hint=f"nodes here: {known} (`iadeep status`)")
        labels = {label for n in nodes for label in n.labels}
        missing = [label for label in spec.constraint if label not in labels]
        if missing:
            raise InputError(f"--constraint: no node has the label {', '.join(missing)}",
                             hint=f"labels here: {', '.join(sorted(labels)) or 'none'} "
                                  "(labels: in nodes.yaml)")
        allowed = [n for n in nodes if node_allowed(spec, n.name, n.labels)]
        if not allowed:
            raise InputError(f"no node meets all of {node_rules(spec)}",
                             hint="nodes and their labels are in the inventory "
                                  "(nodes.yaml); loosen one of them")
        return allowed

    def _checked_dependencies(self, conn, spec: JobSpec) -> JobSpec:
        """``spec`` with every dependency naming a job (requests/update.py's changes too)."""
        return _with_dependencies(conn, spec)

    def _owned(self, conn, user: str, job_id: int) -> Job:
        job = jobrows.get(conn, job_id)
        if job.owner != user and not self.inventory.is_admin(user):
            raise PermissionDenied(
                f"job {job_id} belongs to {job.owner}; {user} may not change it",
                hint="only a job's owner or a lab admin (lab.admins in nodes.yaml) can")
        return job

    def op_fence(self, user: str, req: m.FenceRequest) -> m.FenceResult:
        """An admin declares a node's job attempts dead (it is powered off or gone): its lost
        jobs may then run again elsewhere."""
        with self.store.tx() as conn:   # a node removed (or renamed) with jobs on it: fenceable
            recorded = jobrows.select(conn, states=ACTIVE | {JobState.LOST}, node=req.node)
        if self.inventory.node(req.node) is None and not recorded:
            known = ", ".join(n.name for n in self.inventory.nodes) or "none"
            raise InputError(f"no node named {req.node!r} in the controller's inventory",
                             hint=f"known nodes: {known}")
        nodes = self.port.nodes()
        if nodes is None:
            raise InputError("this controller schedules no nodes",
                             hint="start it with an inventory that lists nodes")
        if not req.force:
            self._refuse_fencing_a_live_node(req.node)
        jobs = nodes.fence(req.node, user)
        self.wake()
        return m.FenceResult(req.node, tuple(jobs))

    def _refuse_fencing_a_live_node(self, node: str) -> None:
        """A node heard from within ``node_grace`` answers, so its jobs most likely still run:
        fencing it would start them a second time (or fail them). Says what fencing would do."""
        with self.store.tx() as conn:
            seen = {n.name: (n, since) for n, since in cluster.load_nodes(conn)}
            jobs = jobrows.select(conn, states=ACTIVE | {JobState.LOST}, node=node)
        if node not in seen:
            return                      # never heard from: nothing says it is alive
        snap, down_since = seen[node]
        ago = max(self.clock() - (snap.taken_at if down_since is None else down_since), 0.0)
        grace = self.inventory.node_grace_s
        if ago >= grace:
            return
        would = ", ".join(
            f"{j.id} ({'requeued' if j.attempts - j.checkpoints <= j.spec.retries else 'failed'})"
            for j in jobs) or "none"
        raise InputError(
            f"node {node} was heard from {duration(ago)} ago, within node_grace "
            f"({duration(grace)}): it looks alive; fencing it would end its jobs' attempts while "
            f"they may still run there (jobs: {would})",
            hint=f"fence only a node that is powered off; if it is, `iadeep nodes fence {node} "
                 "--force`")

    def op_report(self, user: str, req: m.ReportRequest) -> dict:
        """`iadeep report` for those who may not read the database: admins (and root) see the
        whole lab's accounting, every other member their own jobs' only."""
        from ...store import report as accounting

        if not self.inventory.is_admin(user):
            if req.owner not in (None, user):
                raise PermissionDenied(
                    f"{user} may see only their own jobs' accounting, not {req.owner}'s",
                    hint="lab admins (lab.admins in nodes.yaml) see everyone's")
            req = dataclasses.replace(req, owner=user)
        if req.by is not None and req.by not in accounting.GROUPINGS:
            raise InputError(f"by must be one of {', '.join(accounting.GROUPINGS)}",
                             hint="e.g. --by user")
        if not req.since < req.until:
            raise InputError("since must be before until", hint="the window is [since, until)")
        now = self.clock()
        with self.store.tx() as conn:
            rep = accounting.report(conn, req.since, req.until, by=req.by, user=req.owner,
                                    running=bool(req.running), now=now)
            daily = None if not req.daily else accounting.report(
                conn, req.since, req.until, by="day", user=req.owner, running=bool(req.running),
                now=now)
        return {"report": accounting.report_to_dict(rep),
                "daily": None if daily is None else accounting.report_to_dict(daily),
                "only": req.owner}

    def op_ping(self, user: str, req: m.PingRequest) -> m.PingResult:
        return m.PingResult(user, self.inventory.is_admin(user))

    # ------------------------------------------------------------------ profiles
    def op_profile_pin(self, user: str, req: m.ProfilePinRequest) -> m.PinResult:
        return self._pin(user, req.label, pin=True, adopt=req.adopt)

    def op_profile_unpin(self, user: str, req: m.ProfileUnpinRequest) -> m.PinResult:
        return self._pin(user, req.label, pin=False)

    def op_profile_pairs(self, user: str, req: m.PairsRequest) -> list[m.ColocationView]:
        with self.store.read() as conn:
            return _pair_views(conn)

    def op_profile_pair_adopt(self, user: str, req: m.PairsAdoptRequest
                              ) -> list[m.ColocationView]:
        """Held co-location rows become the lab's (the model's next refit and self-tuning's
        next replay use them)."""
        with self.store.tx() as conn:
            profrows.adopt_colocations(conn, req.ids, user)
            rows = _pair_views(conn, req.ids)
        log.info("%s adopted co-location rows %s", user, ", ".join(map(str, req.ids)))
        return rows

    def op_profile_pair_remove(self, user: str, req: m.PairsRemoveRequest
                               ) -> list[m.ColocationView]:
        """Co-location rows removed (held or the lab's); the model's next refit goes without
        them."""
        with self.store.tx() as conn:
            rows = _pair_views(conn, req.ids)
            profrows.remove_colocations(conn, req.ids)
        log.info("%s removed co-location rows %s", user, ", ".join(map(str, req.ids)))
        return rows

    def _pin(self, user: str, label: str, pin: bool, adopt: str | None = None
             ) -> m.PinResult:
        """Admins freeze a profile against learning (or let it learn again), first making a
        user's held phase profile the lab's (``adopt``)."""
        with self.store.tx() as conn:
            if adopt is not None:
                profrows.adopt(conn, label, adopt, user, self.clock())
            profrows.set_pinned(conn, label, user if pin else None, self.clock(),
                                shipped_profiles().get(label))
        return m.PinResult(label, user if pin else None)

    def _copies_bytes(self) -> int:
        """The lab's bound on every member's script copies together, in bytes."""
        return int(self.inventory.script_copies_gib * 2**30)

    def op_input(self, user: str, req: m.InputRequest) -> m.JobActionResult:
        """Keystrokes for the caller's running `iadeep run --pty` job (requests/interactive)."""
        with self.store.tx() as conn:
            job = jobrows.get(conn, req.id)
        nodes = self.port.nodes()
        result = interactive.write(nodes.write_input if nodes is not None else None, job, user,
                                   req)
        self.port.heard(job.id, self.clock())
        return result

    def op_logs(self, user: str, req: m.LogsRequest) -> m.LogChunk:
        if req.offset < 0 or req.max_bytes < 0:
            raise InputError(f"offset and max_bytes must be 0 or more, got {req.offset}, "
                             f"{req.max_bytes}")
        if req.stream not in STREAMS:
            raise InputError(f"stream must be one of {', '.join(STREAMS)}, got "
                             f"{req.stream[:40]!r}", hint="client and controller versions differ?")
        with self.store.tx() as conn:
            job = jobrows.get(conn, req.id)
        if job.owner != user and not self.inventory.is_admin(user):
            raise PermissionDenied(f"job {req.id} belongs to {job.owner}; {user} may not read "
                                   "its log",
                                   hint="a job's log is its owner's and the lab admins' only")
        if job.spec.interactive and job.owner == user:   # its client is there (interactive)
            self.port.heard(job.id, self.clock())
        if req.stream == "error" and job.spec.error is None:
            raise InputError(f"job {job.id} has no separate stderr: it goes with its stdout",
                             hint=f"iadeep logs {job.id} shows both; submit with --error FILE "
                                  "to keep them apart")
        if job.node is None:
            return m.LogChunk(data="", offset=0, finished=job.state in FINISHED,
                              state=job.state)
        nodes = self.port.nodes()
        if nodes is None:
            raise InputError("this controller has no node connections to read logs from",
                             hint="start it with an inventory: "
                                  "iadeep controller run --inventory FILE")
        try:
            data, offset, size = self._read_log(nodes, job, req)
        except NotFoundError:
            if (job.spec.output if req.stream == "output" else job.spec.error) is None:
                raise
            # its --output/--error was never opened (the job failed before it ran, saying why
            # in its job directory's log): that log, rather than nothing
            own = dataclasses.replace(job, spec=dataclasses.replace(job.spec, output=None,
                                                                    error=None))
            data, offset, size = self._read_log(nodes, own, req, "output")
        return m.LogChunk(data=data, offset=offset, size=size,
                          finished=job.state in FINISHED, state=job.state)

    def _read_log(self, nodes: NodeWork, job: Job, req: m.LogsRequest,
                  stream: str | None = None) -> tuple[str, int, int | None]:
        """The log's chunk from the job's node; a node that does not answer (down, or its
        network gone) is said as such, with what happens to the job meanwhile, for its owner:
        not the admin's connection hint."""
        try:
            return nodes.read_log(job, req.offset, req.max_bytes, stream or req.stream)
        except NodeError as exc:
            silent = self._node_silent_since(job.node or "")
            if silent is None and job.state != JobState.LOST:
                raise                   # it answers: the error is the read's own
            raise NodeError(f"node {job.node} does not answer"
                            + (f" (since {clock(silent)})" if silent is not None else "")
                            + f", so job {job.id}'s log cannot be read now; "
                            + self._meanwhile(job, silent),
                            hint=f"`iadeep logs {job.id} --follow` waits for the node to "
                                 f"answer; `iadeep queue why {job.id}` says what happens to "
                                 f"the job (technical detail: {exc.message})") from None

    def _node_silent_since(self, node: str) -> float | None:
        """When ``node`` stopped answering the round's polls (its GPU query failing is not
        that), None if its last poll answered."""
        with self.store.tx() as conn:
            return next((since for n, since in cluster.load_nodes(conn) if n.name == node),
                        None)

    def _meanwhile(self, job: Job, silent: float | None) -> str:
        """What happens to ``job`` while its node stays silent, as its owner needs to know."""
        if job.state in FINISHED:
            return f"the job has {job.state.value}; its log is read once the node is back"
        if job.state == JobState.LOST:
            return f"the job is lost: {job.reason}" if job.reason else "the job is lost"
        grace = self.inventory.node_grace_s
        left = grace if silent is None else max(0.0, silent + grace - self.clock())
        return (f"the job stays {job.state.value} (it may still run there) for up to "
                f"node_grace ({duration(grace)}, {duration(left)} left); then it is marked "
                "lost, and `iadeep queue why` says whether it is run again")


def _with_forecast(view: m.JobView, f: JobForecast | None) -> m.JobView:
    """A listed job with its expected start (waiting) and end (unfinished), if foreseen."""
    if f is None or view.state in FINISHED:
        return view
    if view.state == JobState.QUEUED:
        return dataclasses.replace(view, expected_start=f.start, expected_start_low=f.start_low,
                                   expected_start_high=f.start_high, expected_end=f.end)
    return dataclasses.replace(view, expected_end=f.end)


def _gpu_sizes(listed: tuple[int, ...] | None, snap: NodeSnapshot | None
               ) -> list[float | None] | None:
    """Memory (MiB; None where not reported) of each GPU a node lets iadeep schedule, from its
    last snapshot; only their number if it was never seen but lists ``gpus:``; else None."""
    if snap is not None and snap.gpus:
        return [g.memory_total_mib for g in snap.gpus if listed is None or g.index in listed]
    return None if listed is None else [None] * len(listed)


def _targets(conn, req: m.JobsRequest, applies: frozenset[JobState]
             ) -> list[tuple[int, IadeepError | None]]:
    """The jobs a cancel/hold/release names, each with what keeps it from being acted on (None:
    nothing). An array's id names its tasks in a state the action ``applies`` to (cancelling
    an array leaves its finished tasks alone); if none is, the id itself, so its refusal says
    why. A (array id, index) pair names that task alone (its newest run)."""
    out: list[tuple[int, IadeepError | None]] = []
    for job_id in req.ids:
        tasks = [t.id for t in jobrows.array_tasks(conn, job_id) if t.state in applies]
        out += [(t, None) for t in tasks] or [(job_id, None)]
    for array_id, index in req.tasks:
        found = [t.id for t in jobrows.array_tasks(conn, array_id) if t.array_index == index]
        out.append((found[-1], None) if found else (array_id, NotFoundError(
            f"array {array_id} has no task {index}",
            hint=f"`iadeep queue list --all` shows the array's tasks as {array_id}_INDEX")))
    return out


def _with_dependencies(conn, spec: JobSpec) -> JobSpec:
    """The spec with its dependencies checked: every id must name a job (anyone's: depending
    on another user's job is fine). An array's id stands for all its tasks, as in Slurm."""
    deps = dependencies(spec)
    if not deps:
        return spec
    known = jobrows.states(conn, (dep for _, dep in deps))
    for option, dep in deps:
        if dep not in known:
            raise InputError(f"{option} {dep}: there is no job {dep}",
                             hint="`iadeep queue list --all` shows every job id")

    def expand(ids: tuple[int, ...]) -> tuple[int, ...]:
        out: list[int] = []
        for dep in ids:
            out += [t.id for t in jobrows.array_tasks(conn, dep)] or [dep]
        return tuple(dict.fromkeys(out))

    spec = dataclasses.replace(spec, after=expand(spec.after), after_any=expand(spec.after_any),
                               after_fail=expand(spec.after_fail))
    validate_spec(spec)   # the expanded list is within MAX_DEPENDENCIES too
    return spec


def _script_content(path: str, script_b64: str | None) -> bytes:
    if script_b64 is None:
        raise InputError("the request carries no script content",
                         hint="submit with `iadeep queue add` (it sends the script)")
    try:
        content = base64.b64decode(script_b64, validate=True)
    except (ValueError, TypeError):
        raise InputError("malformed script content in the request") from None
    if len(content) > MAX_SCRIPT_BYTES:
        raise InputError(f"script {path} is larger than {MAX_SCRIPT_BYTES // 2**20} MiB",
                         hint="submit a small launcher script that starts your program")
    return content


def _write_script(directory: Path, original: str, content: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    # a full disk: no half-written copy left behind
    replace_file(directory / Path(original).name, content, mode=0o700, durable=True)


@dataclass(frozen=True)
class Operation:
    """One operation of the protocol. ``handler(answerer, caller, request)`` returns the reply
    (a message); the answerer is the Service, or for ``offline`` operations any
    ``views.Reader``: these read only the recorded state, so readers answer them from the
    database or the public snapshot while the controller is down. ``admin_only``: the refusal
    a caller who is not a lab admin gets (``{user}``: the caller)."""

    request: type[m.Request]
    handler: Callable[[Any, str, Any], object]
    offline: bool = False
    admin_only: str | None = None


def _pair_views(conn: Any, ids: tuple[int, ...] | None = None) -> list[m.ColocationView]:
    """The co-location rows (``ids`` only, in that order, if given) as views."""
    rows = {r["id"]: r for r in profrows.colocation_rows(conn)}
    chosen = [rows[i] for i in dict.fromkeys(ids) if i in rows] if ids is not None \
        else list(rows.values())
    return [m.ColocationView.from_dict(r) for r in chosen]


_PIN_REFUSAL = "{user} may not pin or unpin profiles"
_PAIRS_REFUSAL = ("only a lab admin may list, adopt or remove co-location rows; {user} is not "
                  "one")
OPERATIONS: dict[str, Operation] = {o.request.op: o for o in (
    Operation(m.AddRequest, Service.op_add),
    Operation(m.TrialRequest, Service.op_test_only),
    Operation(m.CancelRequest, Service.op_cancel),
    Operation(m.HoldRequest, Service.op_hold),
    Operation(m.ReleaseRequest, Service.op_release),
    Operation(m.PriorityRequest, Service.op_priority),
    Operation(m.RequeueRequest, Service.op_requeue),
    Operation(m.RerunRequest, Service.op_rerun),
    Operation(m.UpdateRequest, update.op_update),   # owner or admin: checked by the handler
    # It decides who the admins are, and which nodes jobs run on.
    Operation(m.ReloadRequest, Service.op_reload,
              admin_only="{user} may not reload the controller's inventory"),
    # A wrong fence can run a job twice.
    Operation(m.FenceRequest, Service.op_fence,
              admin_only="only a lab admin may fence a node; {user} is not one"),
    # Drained nodes take no new jobs (requests/drain.py).
    Operation(m.DrainRequest, drain.op_drain,
              admin_only="only a lab admin may drain or resume a node; {user} is not one"),
    Operation(m.PingRequest, Service.op_ping),
    Operation(m.ReportRequest, Service.op_report),
    Operation(m.ListRequest, views.list_jobs, offline=True),
    Operation(m.ShowRequest, views.show_job, offline=True),
    Operation(m.StatusRequest, views.status, offline=True),
    Operation(m.LogsRequest, Service.op_logs),
    Operation(m.InputRequest, Service.op_input),
    Operation(m.ProfilesRequest, views.profiles, offline=True),
    Operation(m.ProfilePinRequest, Service.op_profile_pin, admin_only=_PIN_REFUSAL),
    Operation(m.ProfileUnpinRequest, Service.op_profile_unpin, admin_only=_PIN_REFUSAL),
    # Co-location rows: the model's refit and self-tuning learn from the lab's (store/profiles)
    Operation(m.PairsRequest, Service.op_profile_pairs, admin_only=_PAIRS_REFUSAL),
    Operation(m.PairsAdoptRequest, Service.op_profile_pair_adopt, admin_only=_PAIRS_REFUSAL),
    Operation(m.PairsRemoveRequest, Service.op_profile_pair_remove, admin_only=_PAIRS_REFUSAL),
    # Reservations (requests/reservations.py): they decide who may use which GPUs when.
    Operation(m.ReserveAddRequest, reservations.op_add,
              admin_only="only a lab admin may reserve GPUs; {user} is not one"),
    Operation(m.ReserveListRequest, reservations.op_list),
    Operation(m.ReserveDeleteRequest, reservations.op_delete,
              admin_only="only a lab admin may delete a reservation; {user} is not one"),
)}

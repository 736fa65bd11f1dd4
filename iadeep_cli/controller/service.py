"""The requests the controller answers. Each one: check who asks, make one store change.

The caller's user name comes from the socket's peer credentials (``server``), never from the
request, so nobody can act as someone else. Owners act on their own jobs; admins listed in the
inventory (and root) on any.

Every argument is checked against its ``op_*`` parameter's annotation before the op runs
(``checks.typed``): a request from any local account is untrusted, and an ill-typed one is
the caller's mistake (InputError), never a controller bug.
"""
from __future__ import annotations

import base64
import functools
import inspect
import os
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import checks
from ..errors import IadeepError, InputError, InvalidTransition, PermissionDenied
from ..inventory import Inventory
from ..jobs import (
    ACTIVE,
    FINISHED,
    Job,
    JobSpec,
    JobState,
    check_priority,
    spec_from_dict,
    validate_spec,
)
from ..model.data import shipped_profiles
from ..paths import StateDir
from ..snapshot import NodeSnapshot
from ..store import Store, cluster, jobs as jobrows, profiles as profrows
from ..text import MIB_PER_GIB
from . import views
from .catalog import profile_views

MAX_SCRIPT_BYTES = 4 * 1024 * 1024
LogReader = Callable[[Job, int, int], dict]


class Service:
    reload: Callable[[], dict]   # re-read the inventory: runtime.Controller.reload

    def __init__(self, store: Store, inventory: Inventory, clock: Callable[[], float] = time.time,
                 log_reader: LogReader | None = None, scripts_dir: Path | None = None):
        self.store = store
        self.scripts_dir = scripts_dir or StateDir(store.path.parent).scripts
        self.inventory = inventory
        self.clock = clock
        self.log_reader = log_reader
        self.wake: Callable[[], None] = lambda: None   # the loop sets this to react at once
        self.fencer: Callable[[str, str], list[int]] | None = None   # the loop's fence()
        self.degraded: IadeepError | None = None   # set by the runtime: why new jobs are refused

    # ------------------------------------------------------------------ dispatch
    def handle(self, op: str, args: dict[str, Any], user: str) -> Any:
        method = getattr(self, f"op_{op}", None) if op.isidentifier() else None
        if method is None:
            raise InputError(f"unknown request {op[:40]!r}",
                             hint="client and controller versions differ?")
        if "user" in args:
            raise InputError("malformed request: a request cannot name its user",
                             hint="identity comes from the socket (the calling account)")
        try:
            inspect.signature(method).bind(user, **args)
        except TypeError as exc:
            raise InputError(f"malformed {op!r} request: {exc}",
                             hint="client and controller versions differ?") from None
        hints = _arg_hints(type(self), op)  # type: ignore[arg-type]  # mypy checks the instances' __hash__
        return method(user, **{k: checks.typed(k, v, hints[k]) for k, v in args.items()})

    # ------------------------------------------------------------------ writes
    def op_add(self, user: str, spec: dict, token: str | None = None,
               script_b64: str | None = None) -> dict:
        """Queue a job. The script's content travels with the request and is kept with the
        job, like sbatch does: editing the file later does not change a queued job."""
        if self.degraded is not None:
            raise self.degraded
        job_spec = spec_from_dict({"retries": self.inventory.default_retries, **spec})
        validate_spec(job_spec)
        if token is not None:
            checks.text("token", token, max_len=128)
        content = _script_content(job_spec.script, script_b64)
        with self.store.tx() as conn:
            self._check_runnable(conn, user, job_spec)
            job_id, created = jobrows.insert(conn, user, job_spec, self.clock(), token)
            if created:  # written before COMMIT: an accepted job always has its script
                _write_script(self.scripts_dir / str(job_id), job_spec.script, content)
        self.wake()
        return {"id": job_id, "created": created}

    def op_cancel(self, user: str, ids: list[int]) -> list[dict]:
        return self._each(ids, lambda i: self._cancel_one(user, i))

    def _cancel_one(self, user: str, job_id: int) -> dict:
        with self.store.tx() as conn:
            job = self._owned(conn, user, job_id)
            if job.state in ACTIVE:
                # The loop stops the process group on its node, then records 'cancelled'.
                jobrows.update(conn, job_id, cancel_requested_by=user)
                self.wake()
                return {"id": job_id, "state": "cancelling"}
            # A lost job may still run on its silent node: the loop stops it when it answers.
            orphans = job.orphans_with(job.node) if job.state == JobState.LOST else job.orphans
            jobrows.transition(conn, job_id, JobState.CANCELLED, f"cancelled by {user}", user,
                               self.clock(), ended_at=self.clock(), orphans=orphans)
        return {"id": job_id, "state": JobState.CANCELLED.value}

    def op_hold(self, user: str, ids: list[int]) -> list[dict]:
        return self._each(ids, lambda i: self._move(user, i, JobState.HELD, f"held by {user}"))

    def op_release(self, user: str, ids: list[int]) -> list[dict]:
        out = self._each(ids, lambda i: self._move(user, i, JobState.QUEUED,
                                                   f"released by {user}"))
        self.wake()
        return out

    @staticmethod
    def _each(ids: list[int], act: Callable[[int], dict]) -> list[dict]:
        """Act on every id; one failure (not yours, unknown id) does not stop the others."""
        results = []
        for job_id in ids:
            try:
                results.append(act(job_id))
            except IadeepError as exc:
                results.append({"id": job_id, "error": exc.to_dict()})
        return results

    def _move(self, user: str, job_id: int, new: JobState, reason: str) -> dict:
        with self.store.tx() as conn:
            self._owned(conn, user, job_id)
            job = jobrows.transition(conn, job_id, new, reason, user, self.clock())
        return {"id": job.id, "state": job.state.value}

    def op_priority(self, user: str, id: int, priority: int) -> dict:
        check_priority(priority)
        with self.store.tx() as conn:
            job = self._owned(conn, user, id)
            if job.state in FINISHED:
                raise InvalidTransition(f"job {id} is {job.state}; its priority no longer matters")
            jobrows.update(conn, job.id, priority=priority)
            jobrows.add_event(conn, job.id, self.clock(), job.state, job.state,
                              f"priority {job.spec.priority} -> {priority} by {user}", user)
        self.wake()
        return {"id": job.id, "priority": priority}

    def op_reload(self, user: str) -> dict:
        """Re-read the inventory file (runtime.Controller.reload). Admins only: it decides who
        the admins are, and which nodes jobs run on."""
        if not self.inventory.is_admin(user):
            raise PermissionDenied(f"{user} may not reload the controller's inventory",
                                   hint="ask a lab admin (lab.admins in nodes.yaml) or root")
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
        seen = {snap.name: snap for snap, _ in cluster.load_nodes(conn)}
        sizes = [_gpu_sizes(node.gpus, seen.get(node.name)) for node in self.inventory.nodes]
        nodes = [s for s in sizes if s is not None]
        if not nodes or len(nodes) < len(sizes):
            return
        need = (spec.mem_gib or 0.0) * MIB_PER_GIB
        if any(sum(1 for size in gpus if size is None or size >= need) >= spec.gpus
               for gpus in nodes):
            return
        most = max(len(gpus) for gpus in nodes)
        if spec.gpus > most:
            raise InputError(
                f"the job needs {spec.gpus} GPUs on one node; the largest node here has {most}",
                hint=f"ask for at most {most} with --gpus (a job runs on one node), or add a "
                     "larger node to the inventory")
        largest = max(size for gpus in nodes for size in gpus if size is not None) / MIB_PER_GIB
        each = "" if spec.gpus == 1 else f" on each of {spec.gpus} GPUs of one node"
        raise InputError(
            f"the job needs {spec.mem_gib:g} GiB of GPU memory{each}; the largest GPU here has "
            f"{largest:.1f} GiB", hint="--mem is the memory one GPU of the job needs, in GiB")

    def _owned(self, conn, user: str, job_id: int) -> Job:
        job = jobrows.get(conn, job_id)
        if job.owner != user and not self.inventory.is_admin(user):
            raise PermissionDenied(
                f"job {job_id} belongs to {job.owner}; {user} may not change it",
                hint="only a job's owner or a lab admin (lab.admins in nodes.yaml) can")
        return job

    def op_fence(self, user: str, node: str) -> dict:
        """An admin declares a node's job attempts dead (it is powered off or gone): its lost
        jobs may then run again elsewhere.  Admin-only: a wrong fence can run a job twice."""
        if not self.inventory.is_admin(user):
            raise PermissionDenied(f"only a lab admin may fence a node; {user} is not one",
                                   hint="ask an admin listed in lab.admins in nodes.yaml")
        if not isinstance(node, str) or self.inventory.node(node) is None:
            known = ", ".join(n.name for n in self.inventory.nodes) or "none"
            raise InputError(f"no node named {node!r} in the controller's inventory",
                             hint=f"known nodes: {known}")
        if self.fencer is None:
            raise InputError("this controller schedules no nodes",
                             hint="start it with an inventory that lists nodes")
        jobs = self.fencer(node, user)
        self.wake()
        return {"node": node, "jobs": jobs}

    # ------------------------------------------------------------------ reads
    def op_ping(self, user: str) -> dict:
        return {"user": user, "admin": self.inventory.is_admin(user)}

    def op_list(self, user: str, all_states: bool = False, owner: str | None = None) -> list[dict]:
        with self.store.tx() as conn:
            return views.list_jobs(conn, all_states=all_states, user=owner,
                                   reveal=self._reveal(user))

    def op_show(self, user: str, id: int) -> dict:
        with self.store.tx() as conn:
            return views.show_job(conn, id, reveal=self._reveal(user))

    def _reveal(self, user: str) -> views.Reveal:
        """Env values are shown to the job's owner and the admins only."""
        return lambda owner: owner == user or self.inventory.is_admin(user)

    def op_status(self, user: str) -> dict:
        with self.store.tx() as conn:
            data = views.status(conn, self.clock(), self.inventory)
        data["controller"]["degraded"] = self.degraded and self.degraded.to_dict()
        return data

    # ------------------------------------------------------------------ profiles
    def op_profiles(self, user: str) -> list[dict]:
        with self.store.tx() as conn:
            return profile_views(conn)

    def op_profile_pin(self, user: str, label: str) -> dict:
        return self._pin(user, label, pin=True)

    def op_profile_unpin(self, user: str, label: str) -> dict:
        return self._pin(user, label, pin=False)

    def _pin(self, user: str, label: str, pin: bool) -> dict:
        """Admins freeze a profile against learning (or let it learn again)."""
        if not self.inventory.is_admin(user):
            raise PermissionDenied(f"{user} may not pin or unpin profiles",
                                   hint="only lab admins (lab.admins in nodes.yaml) can")
        with self.store.tx() as conn:
            profrows.set_pinned(conn, label, user if pin else None, self.clock(),
                                shipped_profiles().get(label))
        return {"label": label, "pinned_by": user if pin else None}

    def op_logs(self, user: str, id: int, offset: int = 0, max_bytes: int = 65536) -> dict:
        if offset < 0 or max_bytes < 0:
            raise InputError(f"offset and max_bytes must be 0 or more, got {offset}, {max_bytes}")
        with self.store.tx() as conn:
            job = jobrows.get(conn, id)
        if job.owner != user and not self.inventory.is_admin(user):
            raise PermissionDenied(f"job {id} belongs to {job.owner}; {user} may not read its log",
                                   hint="a job's log is its owner's and the lab admins' only")
        if job.node is None:
            return {"data": "", "offset": 0, "finished": job.state in FINISHED,
                    "state": job.state.value}
        if self.log_reader is None:
            raise InputError("this controller has no node connections to read logs from",
                             hint="start it with an inventory: "
                                  "iadeep controller run --inventory FILE")
        result = self.log_reader(job, offset, max_bytes)
        return {**result, "finished": job.state in FINISHED, "state": job.state.value}


@functools.cache
def _arg_hints(cls: type, op: str) -> dict[str, Any]:
    """The annotations of ``op_<op>``'s request arguments (all but the caller's name)."""
    hints = typing.get_type_hints(getattr(cls, f"op_{op}"))
    return {k: v for k, v in hints.items() if k not in ("user", "return")}


def _gpu_sizes(listed: tuple[int, ...] | None, snap: NodeSnapshot | None
               ) -> list[float | None] | None:
    """Memory (MiB; None where not reported) of each GPU a node lets iadeep schedule, from its
    last snapshot; only their number if it was never seen but lists ``gpus:``; else None."""
    if snap is not None and snap.gpus:
        return [g.memory_total_mib for g in snap.gpus if listed is None or g.index in listed]
    return None if listed is None else [None] * len(listed)


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
    target = directory / Path(original).name
    tmp = target.with_suffix(target.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o700)
    os.replace(tmp, target)

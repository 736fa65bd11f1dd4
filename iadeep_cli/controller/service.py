"""The requests the controller answers. Each one: check who asks, make one store change.

The caller's user name comes from the socket's peer credentials (``server``), never from the
request, so nobody can act as someone else. Owners act on their own jobs; admins listed in the
inventory (and root) on any.
"""
from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import IadeepError, InputError, InvalidTransition, PermissionDenied
from ..inventory import Inventory
from ..jobs import (ACTIVE, FINISHED, Job, JobState, spec_from_dict, validate_spec,
                    with_orphan)
from ..model.catalog import profile_views
from ..model.profiles import shipped_profiles
from ..store import Store, jobs as jobrows, profiles as profrows
from . import views

MAX_SCRIPT_BYTES = 4 * 1024 * 1024
LogReader = Callable[[Job, int, int], dict]


class Service:
    def __init__(self, store: Store, inventory: Inventory, clock: Callable[[], float] = time.time,
                 log_reader: LogReader | None = None, scripts_dir: Path | None = None):
        self.store = store
        self.scripts_dir = scripts_dir or store.path.parent / "scripts"
        self.inventory = inventory
        self.clock = clock
        self.log_reader = log_reader
        self.wake: Callable[[], None] = lambda: None   # the loop sets this to react at once
        self.degraded: IadeepError | None = None   # set by the runtime: why new jobs are refused

    # ------------------------------------------------------------------ dispatch
    def handle(self, op: str, args: dict[str, Any], user: str) -> Any:
        method = getattr(self, f"op_{op}", None)
        if method is None:
            raise InputError(f"unknown request {op!r}", hint="client and controller versions differ?")
        try:
            return method(user, **args)
        except TypeError as exc:
            raise InputError(f"malformed {op!r} request: {exc}") from None

    # ------------------------------------------------------------------ writes
    def op_add(self, user: str, spec: dict, token: str | None = None,
               script_b64: str | None = None) -> dict:
        """Queue a job. The script's content travels with the request and is kept with the
        job, like sbatch does: editing the file later does not change a queued job."""
        if self.degraded is not None:
            raise self.degraded
        job_spec = spec_from_dict({"retries": self.inventory.default_retries, **spec})
        validate_spec(job_spec)
        content = _script_content(job_spec.script, script_b64)
        with self.store.tx() as conn:
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
                jobrows.update(conn, job_id, extra={**job.extra, "cancel_requested_by": user})
                self.wake()
                return {"id": job_id, "state": "cancelling"}
            # A lost job may still run on its silent node: the loop stops it when it answers.
            extra = with_orphan(job.extra, job.node) if job.state == JobState.LOST else job.extra
            jobrows.transition(conn, job_id, JobState.CANCELLED, f"cancelled by {user}", user,
                               self.clock(), ended_at=self.clock(), extra=extra)
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
        for raw in ids:
            try:
                results.append(act(int(raw)))
            except IadeepError as exc:
                results.append({"id": raw, "error": exc.to_dict()})
        return results

    def _move(self, user: str, job_id: int, new: JobState, reason: str) -> dict:
        with self.store.tx() as conn:
            self._owned(conn, user, job_id)
            job = jobrows.transition(conn, job_id, new, reason, user, self.clock())
        return {"id": job.id, "state": job.state.value}

    def op_priority(self, user: str, id: int, priority: int) -> dict:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise InputError(f"priority must be an integer, got {priority!r}")
        with self.store.tx() as conn:
            job = self._owned(conn, user, int(id))
            if job.state in FINISHED:
                raise InvalidTransition(f"job {id} is {job.state}; its priority no longer matters")
            jobrows.update(conn, job.id, priority=priority)
            jobrows.add_event(conn, job.id, self.clock(), job.state, job.state,
                              f"priority {job.spec.priority} -> {priority} by {user}", user)
        self.wake()
        return {"id": job.id, "priority": priority}

    def _owned(self, conn, user: str, job_id: int) -> Job:
        job = jobrows.get(conn, job_id)
        if job.owner != user and not self.inventory.is_admin(user):
            raise PermissionDenied(
                f"job {job_id} belongs to {job.owner}; {user} may not change it",
                hint="only a job's owner or a lab admin (lab.admins in nodes.yaml) can")
        return job

    # ------------------------------------------------------------------ reads
    def op_ping(self, user: str) -> dict:
        return {"user": user, "admin": self.inventory.is_admin(user)}

    def op_list(self, user: str, all_states: bool = False, owner: str | None = None) -> list[dict]:
        with self.store.tx() as conn:
            return views.list_jobs(conn, all_states=all_states, user=owner,
                                   reveal=self._reveal(user))

    def op_show(self, user: str, id: int) -> dict:
        with self.store.tx() as conn:
            return views.show_job(conn, int(id), reveal=self._reveal(user))

    def _reveal(self, user: str) -> views.Reveal:
        """Env values are shown to the job's owner and the admins only."""
        return lambda owner: owner == user or self.inventory.is_admin(user)

    def op_status(self, user: str) -> dict:
        with self.store.tx() as conn:
            data = views.status(conn, self.clock())
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
        with self.store.tx() as conn:
            job = jobrows.get(conn, int(id))
        if job.node is None:
            return {"data": "", "offset": 0, "finished": job.state in FINISHED,
                    "state": job.state.value}
        if self.log_reader is None:
            raise InputError("this controller has no node connections to read logs from",
                             hint="start it with an inventory: iadeep controller run --inventory FILE")
        result = self.log_reader(job, int(offset), int(max_bytes))
        return {**result, "finished": job.state in FINISHED, "state": job.state.value}


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

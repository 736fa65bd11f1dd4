"""What readers see while the controller is down, and the public snapshot that makes it safe.

The database is private to the controller's account (it holds every job's ``--env`` values
and arguments), and after a clean stop SQLite could not even open it read-only without write
access to the directory (WAL). So the controller also keeps ``public.json`` (world-readable,
replaced atomically every 30 s and at stop): the status view, the unfinished and the
last ``PUBLIC_FINISHED`` finished jobs with their env values hidden, and the profiles.

Offline, a reader who can read the database (the controller's account, root) reads it; everyone
else reads the snapshot. Nothing here imports paramiko, numpy or scipy.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, TypeVar

from ... import messages as m
from ...errors import ControllerUnavailable, NotFoundError, StoreError
from ...jobs import FINISHED
from ...paths import StateDir, replace_file
from . import views

PUBLIC_FINISHED = 200
R = TypeVar("R")


def _nobody(owner: str) -> bool:
    return False


def public_views(conn, now: float) -> dict:
    """The snapshot's content, from the controller's connection."""
    from ...store import jobrows

    finished = jobrows.select(conn, states=FINISHED, last=PUBLIC_FINISHED)
    return {"written_at": now, "status": m.encode(views.status_view(conn, now)),
            "jobs": m.encode(views.select_jobs(conn, reveal=_nobody) + [
                views.for_reader(m.JobView.from_job(j), _nobody) for j in finished]),
            "finished_kept": PUBLIC_FINISHED, "profiles": m.encode(views.profile_list(conn))}


def publish(state: StateDir, data: dict) -> None:
    """Replace the snapshot atomically: a reader sees the old one or the new one, whole."""
    replace_file(state.public_view, json.dumps(data, separators=(",", ":")), mode=0o644)


def read(request: m.Request[R], down: ControllerUnavailable) -> tuple[R, float]:
    """(the reply, time of the controller's last heartbeat, 0.0 if it never ran) for an
    ``offline`` operation; ``down`` for any other. The caller's name is not needed (""):
    whoever reads the recorded state itself may see all of it."""
    from .service import OPERATIONS

    operation = OPERATIONS[request.op]
    if not operation.offline:
        raise down
    state = StateDir.default()
    db = state.db
    if db.exists() and os.access(db, os.R_OK):
        try:
            return _from_database(operation.handler, request)
        except StoreError:
            pass   # readable, but SQLite needs to write beside it to open it: use the snapshot
    try:
        public = json.loads(state.public_view.read_text())
    except (OSError, ValueError):
        public = None
    if public is not None:
        reader = SnapshotReader(public)
        return operation.handler(reader, "", request), reader.since  # type: ignore[return-value]
    if db.exists():
        raise StoreError(f"the controller is not running, and its database {db} is private "
                         "(it holds every job's env values)",
                         hint="start the controller; it then also keeps a public snapshot, "
                              f"{state.public_view}, for reading while it is down")
    return operation.handler(NeverRan(), "", request), 0.0  # type: ignore[return-value]


def _from_database(handler, request: m.Request[R]) -> tuple[R, float]:
    from ...store import Store, cluster

    store = Store(readonly=True)
    try:
        with store.tx() as conn:
            since = m.ControllerView.from_dict(cluster.get_meta(conn, "controller", {}))
        return handler(views.StoreReader(store), "", request), since.heartbeat_at or 0.0
    finally:
        store.close()


class SnapshotReader(views.Reader):
    """The controller's public snapshot: env values already hidden, no events, and only the
    last ``finished_kept`` finished jobs; node ages count from now."""

    def __init__(self, public: dict[str, Any]):
        self.public = public
        self._status = m.StatusView.from_dict(public["status"])
        self.since = self._status.controller.heartbeat_at or 0.0

    def jobs(self, all_states: bool, owner: str | None, last: int | None = None,
             before: int | None = None) -> list[m.JobView]:
        jobs = [m.JobView.from_dict(j) for j in self.public["jobs"]]
        found = [j for j in jobs if (all_states or j.state not in FINISHED)
                 and (owner is None or j.owner == owner)
                 and (before is None or j.id < before)]
        return found[-last:] if last is not None else found

    def job(self, job_id: int) -> m.JobDetail:
        for job in self.jobs(all_states=True, owner=None):
            if job.id == job_id:
                return m.JobDetail(job)
        raise NotFoundError(
            f"job {job_id} is not in the controller's public snapshot (it is down)",
            hint=f"it keeps unfinished jobs and the last {self.public['finished_kept']} "
                 "finished; start the controller to see every job")

    def status(self) -> m.StatusView:
        """As recorded, but aged to now and judged as the database reader judges a stopped
        controller's nodes: ``up`` only on data younger than STALE_POLLS polls (the recorded
        states were the running controller's, which allowed it the node grace too)."""
        now = time.time()
        stale_s = views.stale_after_s(None, self._status.controller)
        nodes = []
        for n in self._status.nodes:
            age = max(0.0, now - n.snapshot.taken_at)
            state = n.state if n.state is m.NodeState.REMOVED else \
                views.node_state(n.snapshot, age, stale_s, None)
            nodes.append(dataclasses.replace(n, age_s=age, state=state))
        return dataclasses.replace(self._status, now=now, nodes=tuple(nodes),
                                   stale_after_s=stale_s)

    def profiles(self) -> list[m.ProfileView]:
        return [m.ProfileView.from_dict(p) for p in self.public["profiles"]]


class NeverRan(views.Reader):
    """No controller ever ran with this state directory: no jobs, no nodes, the shipped
    profiles."""

    def jobs(self, all_states: bool, owner: str | None, last: int | None = None,
             before: int | None = None) -> list[m.JobView]:
        return []

    def job(self, job_id: int) -> m.JobDetail:
        raise NotFoundError(f"no job with id {job_id}",
                            hint="no controller has run with this state directory yet")

    def status(self) -> m.StatusView:
        return m.StatusView(now=time.time(), nodes=(), queue={}, controller=m.ControllerView())

    def profiles(self) -> list[m.ProfileView]:
        return views.profile_list()

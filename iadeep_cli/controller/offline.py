"""What readers see while the controller is down, and the public snapshot that makes it safe.

The database is private to the controller's account (it holds every job's ``--env`` values
and arguments), and after a clean stop SQLite could not even open it read-only without write
access to the directory (WAL). So the controller also keeps ``public.json`` (world-readable,
replaced atomically every 30 s and at stop): the status view, the unfinished and the
last ``PUBLIC_FINISHED`` finished jobs with their env values hidden, and the profiles.

Offline, a reader who can read the database (the controller's account, root) reads it; everyone
else reads the snapshot. Nothing here imports paramiko or scikit-learn.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from ..errors import ControllerUnavailable, NotFoundError, StoreError
from ..jobs import FINISHED, job_to_dict
from ..paths import StateDir
from . import views

PUBLIC_FINISHED = 200


def _nobody(owner: str) -> bool:
    return False


def public_views(conn, now: float) -> dict:
    """The snapshot's content, from the controller's connection."""
    from ..store import jobs as jobrows
    from .catalog import profile_views

    finished = jobrows.select(conn, states=FINISHED, last=PUBLIC_FINISHED)
    return {"written_at": now, "status": views.status(conn, now),
            "jobs": views.list_jobs(conn, reveal=_nobody) + [
                views.for_reader(job_to_dict(j), _nobody) for j in finished],
            "finished_kept": PUBLIC_FINISHED, "profiles": profile_views(conn)}


def publish(state: StateDir, data: dict) -> None:
    """Replace the snapshot atomically: a reader sees the old one or the new one, whole."""
    target = state.public_view
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def read(op: str, args: dict, down: ControllerUnavailable) -> tuple[Any, float]:
    """(result, time of the controller's last heartbeat, 0.0 if it never ran)."""
    state = StateDir.default()
    db = state.db
    if db.exists() and os.access(db, os.R_OK):
        try:
            return _from_database(op, args, down)
        except StoreError:
            pass   # readable, but SQLite needs to write beside it to open it: use the snapshot
    try:
        public = json.loads(state.public_view.read_text())
    except (OSError, ValueError):
        public = None
    if public is not None:
        return _from_public(public, op, args, down)
    if db.exists():
        raise StoreError(f"the controller is not running, and its database {db} is private "
                         "(it holds every job's env values)",
                         hint="start the controller; it then also keeps a public snapshot, "
                              f"{state.public_view}, for reading while it is down")
    return _never_ran(op, args, down), 0.0


def _from_database(op: str, args: dict, down: ControllerUnavailable) -> tuple[Any, float]:
    from ..store import Store, cluster

    store = Store(readonly=True)
    try:
        with store.tx() as conn:
            since = float(cluster.get_meta(conn, "controller", {}).get("heartbeat_at", 0.0))
            if op == "list":
                return views.list_jobs(conn, all_states=args.get("all_states", False),
                                       user=args.get("owner")), since
            if op == "show":
                return views.show_job(conn, int(args["id"])), since
            if op == "status":
                return views.status(conn, time.time()), since
            if op == "profiles":
                from .catalog import profile_views
                return profile_views(conn), since
    finally:
        store.close()
    raise down


def _from_public(public: dict, op: str, args: dict, down: ControllerUnavailable
                 ) -> tuple[Any, float]:
    status = public["status"]
    since = float(status["controller"].get("heartbeat_at", 0.0))
    if op == "status":
        now = time.time()
        nodes = [{**n, "age_s": max(0.0, now - n["taken_at"])} for n in status["nodes"]]
        return {**status, "now": now, "nodes": nodes}, since
    if op == "profiles":
        return public["profiles"], since
    jobs = public["jobs"]
    if op == "list":
        owner = args.get("owner")
        return [j for j in jobs if (args.get("all_states") or j["state"] not in
                                    {s.value for s in FINISHED})
                and (owner is None or j["user"] == owner)], since
    if op == "show":
        for job in jobs:
            if job["id"] == int(args["id"]):
                return {**job, "events": []}, since
        raise NotFoundError(
            f"job {args['id']} is not in the controller's public snapshot (it is down)",
            hint=f"it keeps unfinished jobs and the last {public['finished_kept']} finished; "
                 "start the controller to see every job")
    raise down


def _never_ran(op: str, args: dict, down: ControllerUnavailable) -> Any:
    if op == "list":
        return []
    if op == "status":
        return {"now": time.time(), "nodes": [], "queue": {}, "controller": {}}
    if op == "profiles":
        from .catalog import profile_views
        return profile_views()
    if op == "show":
        raise NotFoundError(f"no job with id {args['id']}",
                            hint="no controller has run with this state directory yet")
    raise down

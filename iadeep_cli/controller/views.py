"""Read-only views of the store, as plain JSON-able data.

The controller serves these over its socket; when it is down, the CLI computes the very same
views from the database directly and labels them with their age, so `iadeep status` still helps.
"""
from __future__ import annotations

import sqlite3
from typing import Collection

from ..jobs import ACTIVE, FINISHED, JobState, job_to_dict
from ..snapshot import to_dict
from ..store import cluster, jobs as jobrows

UNFINISHED = tuple(s for s in JobState if s not in FINISHED)
# A node's data older than this many poll intervals no longer says it is up: the controller
# stopped, or stopped polling it.
STALE_POLLS = 3
DEFAULT_POLL_S = 10.0


def list_jobs(conn: sqlite3.Connection, *, all_states: bool = False,
              user: str | None = None) -> list[dict]:
    states = None if all_states else UNFINISHED
    return [job_to_dict(j) for j in jobrows.select(conn, states=states, owner=user)]


def show_job(conn: sqlite3.Connection, job_id: int) -> dict:
    data = job_to_dict(jobrows.get(conn, job_id))
    data["events"] = jobrows.events(conn, job_id)
    return data


def node_state(node: dict, poll_s: float, inventory: Collection[str] | None) -> str:
    """``up`` only while fresh; ``removed`` if the running controller's ``inventory`` (None:
    not known, the controller is down) no longer lists it; ``down`` while it fails to answer;
    ``stale`` when its last answer is older than STALE_POLLS poll intervals."""
    if inventory is not None and node["name"] not in inventory:
        return "removed"
    if node["error"] is not None:
        return "down"
    return "stale" if node["age_s"] > STALE_POLLS * poll_s else "up"


def status(conn: sqlite3.Connection, now: float, inventory: Collection[str] | None = None
           ) -> dict:
    """Nodes, their GPUs and what runs on each, the queue summary and how old the data is.
    ``inventory``: the node names the running controller polls (see node_state)."""
    active = jobrows.select(conn, states=ACTIVE)
    on_gpu: dict[tuple[str, int], list[dict]] = {}
    for job in active:
        for index in job.gpu_indices:
            on_gpu.setdefault((job.node, index), []).append(
                {"id": job.id, "name": job.name, "user": job.owner, "state": job.state.value,
                 "predicted_speed": job.predicted_speed, "observed_speed": job.observed_speed})
    controller = cluster.get_meta(conn, "controller", {})
    poll_s = float(controller.get("poll_interval_s") or DEFAULT_POLL_S)
    nodes = []
    for snap, down_since in cluster.load_nodes(conn):
        node = to_dict(snap)
        node["age_s"] = max(0.0, now - snap.taken_at)
        node["down_since"] = down_since
        node["state"] = node_state(node, poll_s, inventory)
        for gpu in node["gpus"]:
            gpu["jobs"] = on_gpu.get((snap.name, gpu["index"]), [])
        nodes.append(node)
    counts = dict(conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
    return {
        "now": now,
        "nodes": nodes,
        "queue": {s.value: counts.get(s.value, 0) for s in JobState},
        "controller": controller,
    }

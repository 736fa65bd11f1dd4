"""Read-only views of the store, as plain JSON-able data.

The controller serves these over its socket; when it is down, the CLI computes the very same
views from the database directly and labels them with their age, so `iadeep status` still helps.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable

from ..inventory import Inventory
from ..jobs import ACTIVE, UNFINISHED, JobState, job_to_dict
from ..snapshot import to_dict
from ..store import cluster, jobs as jobrows

# A node's data older than this many poll intervals no longer says it is up: the controller
# stopped, or stopped polling it (see stale_after_s).
STALE_POLLS = 3
DEFAULT_POLL_S = 10.0

HIDDEN = "(hidden)"
Reveal = Callable[[str], bool]   # may this reader see the env values of this owner's jobs?


def _everyone(owner: str) -> bool:
    return True


def list_jobs(conn: sqlite3.Connection, *, all_states: bool = False, user: str | None = None,
              reveal: Reveal = _everyone) -> list[dict]:
    states = None if all_states else UNFINISHED
    return [for_reader(job_to_dict(j), reveal)
            for j in jobrows.select(conn, states=states, owner=user)]


def show_job(conn: sqlite3.Connection, job_id: int, reveal: Reveal = _everyone) -> dict:
    data = for_reader(job_to_dict(jobrows.get(conn, job_id)), reveal)
    data["events"] = jobrows.events(conn, job_id)
    return data


def stale_after_s(inventory: Inventory | None, controller: dict) -> float:
    """How old a node's data may be and still say "up": STALE_POLLS poll intervals. While the
    controller runs (``inventory`` is its own), at least the grace it gives a silent node: a
    round that waits for a hung node's poll can outlast several intervals, and the healthy
    nodes' data then ages meanwhile without being stale."""
    if inventory is None:
        return STALE_POLLS * float(controller.get("poll_interval_s") or DEFAULT_POLL_S)
    return max(STALE_POLLS * inventory.poll_interval_s, inventory.node_grace_s)


def node_state(node: dict, stale_s: float, inventory: Inventory | None) -> str:
    """``up`` only while fresh; ``removed`` if the running controller's ``inventory`` (None:
    it is not running) no longer lists it; ``down`` while it fails to answer; ``stale`` when
    its last answer is older than ``stale_s``."""
    if inventory is not None and inventory.node(node["name"]) is None:
        return "removed"
    if node["error"] is not None:
        return "down"
    return "stale" if node["age_s"] > stale_s else "up"


def for_reader(job: dict, reveal: Reveal) -> dict:
    """A job as one reader may see it: ``--env`` values (often tokens) only if ``reveal``
    allows it for the job's owner (the owner and the admins); the names stay visible."""
    if reveal(job["user"]):
        return job
    return {**job, "env": dict.fromkeys(job["env"], HIDDEN)}


def status(conn: sqlite3.Connection, now: float, inventory: Inventory | None = None) -> dict:
    """Nodes, their GPUs and what runs on each, the queue summary and how old the data is.
    ``inventory``: the running controller's (None: read from the database, it is not running)."""
    active = jobrows.select(conn, states=ACTIVE)
    on_gpu: dict[tuple[str | None, int], list[dict]] = {}
    for job in active:
        for index in job.gpu_indices:
            on_gpu.setdefault((job.node, index), []).append(
                {"id": job.id, "name": job.name, "user": job.owner, "state": job.state.value,
                 "predicted_speed": job.predicted_speed, "observed_speed": job.observed_speed})
    controller = cluster.get_meta(conn, "controller", {})
    stale_s = stale_after_s(inventory, controller)
    nodes = []
    for snap, down_since in cluster.load_nodes(conn):
        node = to_dict(snap)
        node["age_s"] = max(0.0, now - snap.taken_at)
        node["down_since"] = down_since
        node["state"] = node_state(node, stale_s, inventory)
        for gpu in node["gpus"]:
            gpu["jobs"] = on_gpu.get((snap.name, gpu["index"]), [])
        nodes.append(node)
    counts = dict(conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
    return {
        "now": now,
        "nodes": nodes,
        "queue": {s.value: counts.get(s.value, 0) for s in JobState},
        "controller": controller,
        "stale_after_s": stale_s,
    }

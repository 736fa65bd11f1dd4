"""What the controller last saw of the cluster, and small facts such as its heartbeat.

Read-only views (``iadeep status``, the TUI) show these with their age, so a user can tell a
live picture from a stale one without the CLI ever opening an SSH connection.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..snapshot import ClusterSnapshot, NodeSnapshot, node_from_dict, to_dict


def save_nodes(conn: sqlite3.Connection, nodes: tuple[NodeSnapshot, ...]) -> None:
    """Store each node's latest snapshot. A failed poll keeps the last good GPUs and their
    time (so views show what was last known and how old it is) with the error.  Since when the
    node has not *answered* is remembered apart: the grace period for losing its jobs counts
    from it, and a node whose GPU query fails but which answers is not silent."""
    for node in nodes:
        prev = conn.execute("SELECT data, down_since FROM node_snapshots WHERE node=?",
                            (node.name,)).fetchone()
        data, taken_at, down_since = to_dict(node), node.taken_at, None
        if not node.reached:
            down_since = prev["down_since"] if prev and prev["down_since"] else node.taken_at
        if not node.ok and prev is not None:
            last = json.loads(prev["data"])
            data = {**last, "error": node.error, "jobs": data["jobs"]}
            taken_at = last["taken_at"]
        conn.execute(
            "INSERT INTO node_snapshots (node, taken_at, data, down_since) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(node) DO UPDATE SET taken_at=excluded.taken_at, data=excluded.data, "
            "down_since=excluded.down_since",
            (node.name, taken_at, json.dumps(data), down_since),
        )


def load_nodes(conn: sqlite3.Connection) -> list[tuple[NodeSnapshot, float | None]]:
    """Every node's last snapshot with the time it started failing (None if it answers)."""
    rows = conn.execute("SELECT data, down_since FROM node_snapshots ORDER BY node")
    return [(node_from_dict(json.loads(r["data"])), r["down_since"]) for r in rows]


def load_cluster(conn: sqlite3.Connection) -> ClusterSnapshot | None:
    nodes = [n for n, _ in load_nodes(conn)]
    if not nodes:
        return None
    return ClusterSnapshot(max(n.taken_at for n in nodes), tuple(nodes))


def forget_nodes(conn: sqlite3.Connection, keep: set[str]) -> None:
    """Drop snapshots of nodes removed from the inventory."""
    for (name,) in conn.execute("SELECT node FROM node_snapshots").fetchall():
        if name not in keep:
            conn.execute("DELETE FROM node_snapshots WHERE node=?", (name,))


# the meta key of each user's idle GPU-seconds, summed over every idle spell (the round's idle
# step adds to it, the metrics endpoint reads it)
IDLE_GPU_SECONDS = "idle_gpu_seconds"


def set_meta(conn: sqlite3.Connection, key: str, value: Any) -> None:
    conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                 "SET value=excluded.value", (key, json.dumps(value)))


def get_meta(conn: sqlite3.Connection, key: str, default: Any = None) -> Any:
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return json.loads(row["value"]) if row else default


# ------------------------------------------------------------------ drained nodes
DRAINED = "drained"   # meta key: node -> {"reason", "by", "at"} (`iadeep nodes drain`)


def drained(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    """The drained nodes: no new jobs start there, running ones finish (Slurm's DRAIN)."""
    return dict(get_meta(conn, DRAINED, {}) or {})


def drain_waits(conn: sqlite3.Connection) -> dict[str, str]:
    """Drained node -> why, as the round words it for the jobs that wait (read each round;
    `iadeep nodes drain` is answered by controller/requests/drain.py)."""
    return {node: f"drained by {d['by']}: {d['reason']}" for node, d in drained(conn).items()}


def set_drained(conn: sqlite3.Connection, node: str, reason: str, by: str, at: float) -> None:
    found = drained(conn)
    found[node] = {"reason": reason, "by": by, "at": at}
    set_meta(conn, DRAINED, found)


def clear_drained(conn: sqlite3.Connection, node: str) -> dict[str, Any] | None:
    """Resume ``node``; what its drain was (None: it was not drained)."""
    found = drained(conn)
    was = found.pop(node, None)
    if was is not None:
        set_meta(conn, DRAINED, found)
    return was

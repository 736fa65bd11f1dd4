"""`iadeep status`: nodes, GPUs, what runs where, the queue, and how old all of it is."""
from __future__ import annotations

import typer

from ..controller import client
from ..jobs import UNFINISHED
from ..text import duration, gib, when
from . import render
from .root import app


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def _speeds(job: dict) -> str:
    """' (predicted 0.82, seen 0.80)' when known: how well the sharing goes."""
    parts = [f"{label} {job[key]:.2f}" for label, key in
             (("predicted", "predicted_speed"), ("seen", "observed_speed"))
             if job.get(key) is not None]
    return f" ({', '.join(parts)})" if parts else ""


def _gpu_line(gpu: dict) -> str:
    jobs = ", ".join(f"#{j['id']} {j['user']}/{j['name']}{_speeds(j)}"
                     for j in gpu["jobs"]) or "idle"
    foreign = [p for p in gpu["processes"] if p["job_id"] is None]
    extra = f"  +{len(foreign)} foreign" if foreign else ""
    return (f"  gpu{gpu['index']} {gpu['name']:<16} util {_pct(gpu['utilization_gpu']):>4}  "
            f"mem {gib(gpu['memory_used_mib'])}/{gib(gpu['memory_total_mib'])} GiB  "
            f"{jobs}{extra}")


def _node_state(node: dict) -> str:
    """What is known of a node; only fresh data from a node the controller polls says "up"."""
    last = "up" if node["error"] is None else f"DOWN ({node['error']})"
    state = node.get("state", "up" if node["error"] is None else "down")
    return {"up": last, "down": last, "stale": f"stale (last seen {last})",
            "removed": f"not in the controller's inventory (last seen {last})"}[state]


def _print(data: dict, live: bool) -> None:
    ctl = data.get("controller") or {}
    if live:
        print(f"controller: running (pid {ctl.get('pid')}, "
              f"{len(ctl.get('nodes', data['nodes']))} nodes)")
        if ctl.get("degraded"):
            print(f"  DEGRADED: {ctl['degraded']['message']} (hint: {ctl['degraded']['hint']})")
    elif ctl:
        print("controller: NOT running; last heartbeat "
              f"{when(ctl.get('heartbeat_at'), data['now'])}")
    else:
        print("controller: NOT running (it has never run with this state directory)")
    for node in data["nodes"]:
        print(f"{node['name']}: {_node_state(node)}, data {duration(node['age_s'])} old")
        for gpu in node["gpus"]:
            print(_gpu_line(gpu))
    queue = data["queue"]
    summary = ", ".join(f"{n} {s}" for s, n in queue.items() if n and s in
                        {u.value for u in UNFINISHED}) or "empty"
    print(f"queue: {summary}")


@app.command("status")
def status(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the cluster and the queue as the controller last recorded them."""
    data, stale = client.read("status")
    live = stale is None
    data["live"] = live
    if json_:
        render.as_json(data)
    else:
        _print(render.clean(data), live)

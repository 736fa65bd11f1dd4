"""`iadeep status`: nodes, GPUs, what runs where, the queue, and how old all of it is."""
from __future__ import annotations

import typer

from ..checks import escape
from ..paths import SET_IADEEP_HOME, iadeep_home_set
from ..text import duration, foreign_idle_line, gib, impact, when
from . import render
from .lazy import client, messages as m
from .root import app


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def _speeds(job: m.GpuJob) -> str:
    """' (predicted 0.82, seen 0.80)' when known: how well the sharing goes."""
    parts = [f"{label} {speed:.2f}" for label, speed in
             (("predicted", job.predicted_speed), ("seen", job.observed_speed))
             if speed is not None]
    return f" ({', '.join(parts)})" if parts else ""


def _gpu_line(gpu: m.GpuView) -> str:
    jobs = ", ".join(f"#{j.id} {j.owner}/{j.name}{_speeds(j)}"
                     + (" IDLE" if j.idle_since is not None else "")   # steps/idle.py
                     for j in gpu.jobs) or "idle"
    sample = gpu.sample
    foreign = sample.foreign_processes
    extra = f"  +{len(foreign)} foreign" if foreign else ""
    return (f"  gpu{sample.index} {sample.name:<16} util {_pct(sample.utilization_gpu):>4}  "
            f"mem {gib(sample.memory_used_mib)}/{gib(sample.memory_total_mib)} GiB  "
            f"{jobs}{extra}")


def _node_state(node: m.NodeView) -> str:
    """What is known of a node; only fresh data from a node the controller polls says "up"."""
    last = "up" if node.error is None else f"DOWN ({node.error})"
    return {m.NodeState.UP: last, m.NodeState.DOWN: last,
            m.NodeState.STALE: f"stale (last seen {last})",
            m.NodeState.REMOVED: f"not in the controller's inventory (last seen {last})"
            }[node.state]


def _print(data: m.StatusView, live: bool) -> None:
    ctl = data.controller
    if live:
        print(f"controller: running (pid {ctl.pid}, {len(ctl.nodes)} nodes)")
        if ctl.degraded:
            print(f"  DEGRADED: {ctl.degraded.message} (hint: {ctl.degraded.hint})")
        if ctl.rounds_failing:
            print(f"  DEGRADED: {escape(ctl.rounds_failing)} (hint: the controller's log names the "
                  "error, and the job when a job's data caused it)")
    elif ctl.ran:
        print(f"controller: NOT running; last heartbeat {when(ctl.heartbeat_at, data.now)}")
    elif not iadeep_home_set():   # a member looking in their own default directory
        print("controller: NOT running in your default state directory "
              f"(IADEEP_HOME is not set): {SET_IADEEP_HOME}")
    else:
        print("controller: NOT running (it has never run with this state directory)")
    for node in data.nodes:
        drained = "" if node.drain is None else \
            f", DRAINED by {node.drain.by} {when(node.drain.at, data.now)}: {node.drain.reason}"
        print(f"{node.name}: {_node_state(node)}{drained}, data {duration(node.age_s)} old")
        for gpu in node.gpus:
            print(_gpu_line(gpu))
    for held in data.foreign_idle or ():   # foreign processes holding a GPU idle
        print("  " + foreign_idle_line(held.node, held.gpu, held.pid, held.name, held.mib,
                                       data.now - held.since))
    summary = ", ".join(f"{n} {s}" for s, n in data.unfinished().items()) or "empty"
    print(f"queue: {summary}")
    hour, start = data.impact_last_hour, data.impact_since_start
    if hour is not None:
        line = f"impact factor: {_impact(hour)} in the last hour"
        if start is not None:
            line += f"; {_impact(start)} since the controller started"
        print(line)


def _impact(v: m.ImpactView) -> str:
    return impact(v.impact_factor, v.work_gpu_hours, v.busy_gpu_hours, v.measured_share)


@app.command("status")
def status(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the cluster and the queue as the controller last recorded them."""
    data, stale = client.read(m.StatusRequest())
    live = stale is None
    if json_:
        render.as_json({**m.encode(data), "live": live})
    else:
        _print(render.clean(data), live)

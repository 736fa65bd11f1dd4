"""What `iadeep web` serves: the monitor's view model as JSON, and one static HTML page.

The page's files (``static/page.html``, ``page.css``, ``page.js``) are package data, read once
with ``importlib.resources``: the style and the script go inline into the page, each allowed
by its hash in the Content-Security-Policy.

The page is the monitor in a browser: ``snapshot`` builds the same ``tui.viewmodel.View`` the
terminal UI draws (from the same ``tui.source.fetch``: the controller, or its database when it
is down) and turns it into plain JSON; nothing about placement is computed here. What is left
out on purpose: environment values, scripts, arguments and log contents (none of them is in the
JSON at all). The page's script puts every value into the page as text (``textContent``), never
as markup, so a job named ``<script>`` is shown as those characters; the server's
Content-Security-Policy allows only the page's own inline script and style (by their hashes).
"""
from __future__ import annotations

import base64
import hashlib
from collections import Counter
from importlib import resources
from string import Template
from typing import Any

from ..jobs import JobState
from ..tui import viewmodel as vm
from ..tui.source import MonitorData

# Queue rows sent to the page: a browser lays out a table of thousands of rows in seconds
# (benchmarks/bench_web.py), and the first few hundred are the ones about to start;
# `iadeep queue list` lists them all. Jobs on GPUs are on their node's card whatever this says.
MAX_ROWS = 300
MIN_REFRESH_S = 2.0      # the page asks at the controller's poll interval, within these
MAX_REFRESH_S = 10.0


def _mib_gib(mib: float | None) -> float | None:
    return None if mib is None else round(mib / 1024.0, 1)


def _impact(view: Any) -> dict[str, Any] | None:
    if view is None:
        return None
    return {"factor": view.impact_factor, "busy_gpu_hours": round(view.busy_gpu_hours, 3),
            "work_gpu_hours": round(view.work_gpu_hours, 3),
            "saved_gpu_hours": round(view.saved_gpu_hours, 3)}


def users(data: MonitorData) -> list[dict[str, Any]]:
    """Per user: jobs running and the GPUs they hold, jobs queued and held, and the user's
    fair-share points from the controller's last round (None: fair share is off)."""
    running: Counter[str] = Counter()
    gpus: Counter[str] = Counter()
    queued: Counter[str] = Counter()
    held: Counter[str] = Counter()
    for job in data.jobs:
        if job.state in vm.ON_GPUS:
            running[job.owner] += 1
            gpus[job.owner] += job.gpus
        elif job.state is JobState.QUEUED:
            queued[job.owner] += 1
        elif job.state is JobState.HELD:
            held[job.owner] += 1
    points = data.status.fairshare_points or {}
    names = sorted(set(running) | set(queued) | set(held) | set(points))
    return [{"user": u, "running": running[u], "gpus": gpus[u], "queued": queued[u],
             "held": held[u], "fairshare_points": points.get(u)} for u in names]


def _gpu(gpu: vm.GpuLine) -> dict[str, Any]:
    return {"index": gpu.index, "name": gpu.name, "util": gpu.util,
            "mem_used_gib": _mib_gib(gpu.mem_used_mib),
            "mem_total_gib": _mib_gib(gpu.mem_total_mib),
            "jobs": [{"id": c.id, "owner": c.owner, "name": c.name, "predicted": c.predicted,
                      "observed": c.observed, "level": c.level, "idle": c.idle}
                     for c in gpu.jobs],
            "foreign": [{"pid": p.pid, "name": p.name, "mem_gib": _mib_gib(p.mem_mib)}
                        for p in gpu.foreign],
            "gone": list(gpu.gone)}


def _node(card: vm.NodeCard) -> dict[str, Any]:
    state = "up" if card.up else "stale" if card.stale and card.error is None else "down"
    return {"name": card.name, "state": state, "error": card.error, "drained": card.drained,
            "age_s": round(card.age_s, 1), "gpus": [_gpu(g) for g in card.gpus]}


def snapshot(data: MonitorData, now: float) -> dict[str, Any]:
    """The page's data: one refresh of the monitor's view, as JSON-ready values."""
    view = vm.build_view(data, now)
    status = data.status
    return {
        "now": now,
        "live": data.stale_since is None,
        # the page shows the impact factor on a line of its own: not in the banner as well
        "banner": {"level": view.banner.level,
                   "text": view.banner.text.removesuffix(vm.impact_text(status))},
        "summary": view.summary,
        "refresh_s": min(MAX_REFRESH_S, max(MIN_REFRESH_S, view.poll_interval_s)),
        "impact": {"text": vm.impact_text(status).lstrip(" ·").removeprefix("impact "),
                   "last_hour": _impact(status.impact_last_hour),
                   "since_start": _impact(status.impact_since_start)},
        "nodes": [_node(c) for c in view.nodes],
        "columns": list(vm.COLUMNS),
        "queue": [{"id": r.id, "state": r.state.value, "cells": list(r.cells)}
                  for r in view.rows[:MAX_ROWS]],
        "queue_total": len(view.rows),
        "users": users(data),
    }


# --------------------------------------------------------------------------- the page
def _static(name: str) -> str:
    """One of the page's files, shipped as package data beside this module (``static/``)."""
    return (resources.files("iadeep_cli.web") / "static" / name).read_text(encoding="utf-8")


STYLE = _static("page.css")
SCRIPT = _static("page.js")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# Only this page's own script and style run; the script may fetch from this server only.
CSP = (f"default-src 'none'; script-src {_csp_hash(SCRIPT)}; style-src {_csp_hash(STYLE)}; "
       "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")

# The page with its style and script inline (each allowed by its hash above)
PAGE = Template(_static("page.html")).substitute(style=STYLE, script=SCRIPT)

"""What `iadeep web` serves: the monitor's view model as JSON, and one static HTML page.

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
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .3em}h2{font-size:1.1em;margin:1em 0 .3em}
#banner{padding:.3em .6em;border-radius:4px;background:#e6f4ea}
#banner.stale,#banner.never,#banner.error{background:#fde7e9}
#nodes{display:flex;flex-wrap:wrap;gap:.6em}
.node{border:1px solid #ccc;border-radius:6px;padding:.4em .6em;background:#fff;min-width:22em}
.node h3{margin:0 0 .2em;font-size:1em}.node.down h3,.node.stale h3{color:#b00}
.gpu{border-top:1px solid #eee;padding:.2em 0}
.bar{display:inline-block;width:5em;height:.7em;background:#eee;vertical-align:middle}
.bar span{display:block;height:100%;background:#4a90d9}
.job{display:inline-block;margin:.1em .3em .1em 0;padding:0 .3em;border-radius:3px}
.ok{background:#d7f0dc}.warn{background:#fff1c2}.bad{background:#f9c9cc}.none{background:#dde9f7}
.foreign{background:#eddcf5}.idle{outline:2px solid #b00}.gone{color:#888}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #ddd;padding:.1em .5em;
text-align:left;vertical-align:top}th{background:#f0f0f0}
.muted{color:#777}
"""

SCRIPT = """
"use strict";
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
// a 24-hour clock, as the CLI and the monitor write times (not the browser's locale's AM/PM)
function clock(d) {
  return [d.getHours(), d.getMinutes(), d.getSeconds()]
    .map(x => String(x).padStart(2, "0")).join(":");
}
function num(v, digits) { return v === null || v === undefined ? "-" : v.toFixed(digits); }
function bar(fraction) {
  const b = el("span", "bar"), f = el("span");
  f.style.width = (fraction === null ? 0 : Math.max(0, Math.min(1, fraction)) * 100) + "%";
  b.appendChild(f);
  return b;
}
function gpuDiv(node, g) {
  const d = el("div", "gpu");
  d.dataset.gpu = node + ":" + g.index;
  d.appendChild(el("b", null, "gpu" + g.index + " "));
  d.appendChild(el("span", "muted", g.name + " "));
  d.appendChild(bar(g.util === null ? null : g.util / 100));
  d.appendChild(el("span", null, " " + (g.util === null ? "n/a" : g.util.toFixed(0) + "%") + " "));
  const mem = g.mem_used_gib !== null && g.mem_total_gib ? g.mem_used_gib / g.mem_total_gib : null;
  d.appendChild(bar(mem));
  d.appendChild(el("span", null, " " + num(g.mem_used_gib, 1) + "/" + num(g.mem_total_gib, 0) +
                                 " GiB"));
  const jobs = el("div");
  for (const j of g.jobs) {
    const c = el("span", "job " + j.level + (j.idle ? " idle" : ""),
                 "#" + j.id + " " + j.owner + "/" + j.name +
                 " predicted " + num(j.predicted, 2) + ", seen " + num(j.observed, 2) +
                 (j.idle ? " IDLE" : ""));
    c.dataset.job = j.id;
    jobs.appendChild(c);
  }
  for (const p of g.foreign)
    jobs.appendChild(el("span", "job foreign", "foreign pid " + p.pid + " " + p.name + " " +
                                               num(p.mem_gib, 1) + " GiB"));
  for (const id of g.gone) jobs.appendChild(el("span", "job gone", "#" + id + " (gone)"));
  if (!jobs.childNodes.length) jobs.appendChild(el("span", "muted", "idle"));
  d.appendChild(jobs);
  return d;
}
function render(v) {
  const banner = document.getElementById("banner");
  banner.className = v.banner.level;
  banner.textContent = v.banner.text;
  document.getElementById("summary").textContent = v.summary;
  document.getElementById("impact").textContent = v.impact.text || "no GPU busy yet";
  const nodes = document.getElementById("nodes");
  nodes.replaceChildren();
  for (const n of v.nodes) {
    const s = el("section", "node " + n.state);
    s.dataset.node = n.name;
    s.appendChild(el("h3", null, n.name + (n.state === "up" ? "" : " (" + n.state +
                                 (n.error ? ": " + n.error : "") + ")")));
    if (n.drained) s.appendChild(el("p", "drained", "drained: " + n.drained +
                                    " (no new jobs; running ones finish)"));
    for (const g of n.gpus) s.appendChild(gpuDiv(n.name, g));
    nodes.appendChild(s);
  }
  if (!v.nodes.length) nodes.appendChild(el("p", "muted", "no nodes"));
  const head = el("tr");
  for (const c of v.columns) head.appendChild(el("th", null, c));
  const rows = [head];
  for (const r of v.queue) {
    const tr = el("tr", "state-" + r.state);
    tr.dataset.job = r.id;
    for (const c of r.cells) tr.appendChild(el("td", null, c));
    rows.push(tr);
  }
  document.getElementById("queue").replaceChildren(...rows);
  document.getElementById("more").textContent = v.queue_total > v.queue.length ?
    "and " + (v.queue_total - v.queue.length) + " more (`iadeep queue list` lists them all)" : "";
  const uhead = el("tr");
  for (const c of ["USER", "RUNNING", "GPUS", "QUEUED", "HELD", "FAIR-SHARE"])
    uhead.appendChild(el("th", null, c));
  const urows = [uhead];
  for (const u of v.users) {
    const tr = el("tr");
    tr.dataset.user = u.user;
    for (const c of [u.user, u.running, u.gpus, u.queued, u.held, num(u.fairshare_points, 2)])
      tr.appendChild(el("td", null, c));
    urows.push(tr);
  }
  document.getElementById("users").replaceChildren(...urows);
  document.getElementById("updated").textContent =
    "updated " + clock(new Date(v.now * 1000));
  document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
}
let every = 5;
async function refresh() {
  try {
    const r = await fetch("api/view", {cache: "no-store"});
    const v = await r.json();
    if (!r.ok) throw new Error(v.error || r.statusText);
    every = v.refresh_s;
    render(v);
  } catch (e) {
    const banner = document.getElementById("banner");
    banner.className = "error";
    banner.textContent = "cannot read the cluster: " + e.message;
  }
  setTimeout(refresh, every * 1000);
}
refresh();
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# Only this page's own script and style run; the script may fetch from this server only.
CSP = (f"default-src 'none'; script-src {_csp_hash(SCRIPT)}; style-src {_csp_hash(STYLE)}; "
       "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")

PAGE = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>iadeep</title><style>{STYLE}</style></head>
<body>
<h1>iadeep <span id="updated" class="muted"></span></h1>
<div id="banner">loading…</div>
<p>queue: <span id="summary"></span> · impact factor: <span id="impact"></span></p>
<h2>Nodes and GPUs</h2>
<p class="muted">each job: predicted and seen speed on its GPU (1.00: as fast as alone)</p>
<div id="nodes"></div>
<h2>Queue</h2>
<table id="queue"></table>
<p id="more" class="muted"></p>
<h2>Users</h2>
<table id="users"></table>
<script>{SCRIPT}</script>
</body></html>
"""

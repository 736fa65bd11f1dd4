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

"""``iadeep tune``: the what-if table of self-tuning, for the lab's last N days.

It replays the jobs the lab ran (from the controller's database, read-only, as `iadeep report`
reads it) in the simulator under each candidate setting of plan() (sim/whatif.py), and shows
the settings in force, the one self-tuning would pick (steps/tune.py's rule: better by
3% in average JCT; the controller adopts it after two replays in a row that agree), and what
the controller last replayed and adopted.
"""
from __future__ import annotations

import sys
import time
from datetime import datetime

import typer

from ..errors import IadeepError, InputError
from . import render
from .root import app


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _when(at: float | None) -> str:
    return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M") if at else "never"


def _progress():
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        sys.stderr.write(f"\rreplaying: {done}/{total} candidates{end}")
        sys.stderr.flush()
    return show


@app.command("tune")
def tune(
    days: float | None = typer.Option(None, "--days", help="Replay the jobs submitted in the "
                                      "last N days (default: lab.policy.tune_days, 14)."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Replay the lab's recent jobs under candidate placement settings; show the one in force
    and the one self-tuning would pick."""
    from ..controller.round.steps import tune as selftune
    from ..inventory import load_inventory
    from ..settings import Policy
    from ..sim import whatif
    from ..store import cluster
    from ..text import settings_label
    from .report import open_database

    if days is not None and not 0 < days <= 365:
        raise InputError(f"--days must be in (0, 365], got {days:g}", hint="e.g. --days 14")
    store = open_database("tune")
    try:
        with store.read() as conn:
            record = cluster.get_meta(conn, selftune.META, {}) or {}
        if record.get("base"):
            base = whatif.policy_from_json(record["base"])
        else:   # no controller has recorded its policy yet: nodes.yaml's, else the defaults
            try:
                base = load_inventory().policy
            except IadeepError:   # no readable inventory here: the defaults
                base = Policy()
        policy = selftune.tuned_policy(base, record.get("adopted"))
        window = days if days is not None else base.tune_days
        table = whatif.replay(store, policy, window, time.time(),
                              store.path.with_name("interference-model.json"), _progress())
    finally:
        store.close()
    choice, why = selftune.verdict(table)
    if json_:
        render.as_json({**table, "would_pick": choice, "why": why, "self_tune": base.self_tune,
                        "controller": {k: record.get(k) for k in
                                       ("at", "why", "proposal", "streak", "adopted",
                                        "adopted_at", "history")}})
        return
    state = "on" if base.self_tune else "off (lab.policy.self_tune: false)"
    pinned = ", ".join(base.pinned) or "none"
    typer.echo(f"Self-tuning: {state}; every {base.tune_every_s / 3600:g} h on the last "
               f"{base.tune_days:g} days; pinned in nodes.yaml: {pinned}")
    n = table["gpus"]
    typer.echo(f"Replayed: {table['trace']} submitted in the last {window:g} days, on {n} "
               f"GPU{'s' if n != 1 else ''}")
    rows = []
    force, top = table["in_force"], table.get("best")
    for r in table["outcomes"]:
        mark = ", ".join(m for m, hit in (("in force", r["settings"] == force),
                                          ("best", r["settings"] == top)) if hit)
        rows.append([r["label"], _h(r["avg_jct_s"]), _h(r["p95_jct_s"]), _h(r["avg_wait_s"]),
                     _h(r["p95_wait_s"]), mark])
    if rows:
        render.table(["SETTINGS", "AVG JCT H", "P95 JCT H", "AVG WAIT H", "P95 WAIT H", ""],
                     rows)
    typer.echo(f"In force: {settings_label(force)}")
    if choice is not None:
        typer.echo(f"Would pick: {settings_label(choice)}: {why}")
    else:
        typer.echo(f"Would keep: {settings_label(force)}: {why}")
    if not base.self_tune:
        typer.echo("Self-tuning is off: nothing is adopted.")
    elif record.get("at"):
        line = f"Controller's last replay: {_when(record.get('at'))}: {record.get('why', '')}"
        if record.get("proposal"):
            line += f" ({record.get('streak')} of {selftune.STREAK} replays in a row)"
        typer.echo(line)
    if record.get("adopted"):
        at = record.get("adopted_at")
        typer.echo(f"Adopted{' ' + _when(at) if at else ''}: "
                   f"{settings_label(record['adopted'])}"
                   + (" (self-tuning off: not applied)" if not base.self_tune else
                      f" (pinned keys keep nodes.yaml's value: {pinned})" if base.pinned
                      else ""))

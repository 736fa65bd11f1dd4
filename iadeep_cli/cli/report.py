"""`iadeep report`: who used the GPUs over a time window, how long jobs waited, how fast they
ran while sharing (what ``sacct``/``sreport`` answer on Slurm).

It reads the controller's database directly, read-only, rather than asking the controller over
its socket: accounting is wanted most when something went wrong (the controller is down, or
busy), a read-only SQLite reader in WAL mode never blocks the controller's writes, and the
database is the only place the whole history is kept (the public snapshot holds the last 200
finished jobs). Only the controller's account and root may read it (it holds every job's env
values and arguments); anyone else gets the report from the running controller (admins the
lab's, members their own jobs'). The definitions are in ``store/report.py``.
"""
from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..errors import InputError, NotFoundError, PermissionDenied
from ..paths import SET_IADEEP_HOME, StateDir
from ..text import DURATION_FORMS, clock, duration, parse_duration, pyplot, save_plot
from . import render
from .root import app

if TYPE_CHECKING:
    from ..store import Store, report as accounting

# The store (sqlite3) and csv are imported inside the command: every other command's start-up
# stays as it was (tests/integration/test_startup.py).
GROUPINGS = ("user", "workload", "node", "day")   # as store/report.py's

_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S",
            "%Y-%m-%d %H:%M:%S")
_TIME_HINT = (f"a time ago ({DURATION_FORMS}) or a local date and time "
              "(2026-11-01, 2026-11-01T14:30)")


def parse_time(text: str, option: str, now: float) -> float:
    """``7d`` (that long before ``now``) or a local date/time, as a Unix time; anything else
    is a one-line InputError naming the option."""
    value = text.strip()
    ago = parse_duration(value, bare_s=None)   # as --time and nodes.yaml write durations
    if ago is not None:
        return now - ago
    if value == "now":
        return now
    for fmt in _FORMATS:
        try:
            return datetime.strptime(value, fmt).timestamp()
        except ValueError:
            continue
    raise InputError(f"{option} {text[:40]!r} is not a time", hint=f"give {_TIME_HINT}")


def open_database(command: str = "report") -> Store:
    """The controller's database, read-only; a one-line error when there is none or the caller
    may not read it. ``command``: the `iadeep` command asking, named in that error; only
    `report` can also be answered by a running controller, so only its hint says so."""
    from ..store import Store

    state = StateDir.default()
    db = state.db
    try:
        os.stat(db)
        readable = os.access(db, os.R_OK)
    except FileNotFoundError:
        raise NotFoundError(f"no database at {db}: no controller has run with this state "
                            "directory", hint=SET_IADEEP_HOME
                            ) from None
    except PermissionError:   # the state directory itself is closed to this account
        readable = False
    if not readable:
        owner = _owner(db)
        as_owner = f"sudo -u {owner} sh -lc 'iadeep {command}'"
        hint = (f"start the controller (it reports to admins and members), or run it as that "
                f"account (e.g. {as_owner})") if command == "report" else \
            f"run it as that account: {as_owner}"
        raise PermissionDenied(
            f"`iadeep {command}` reads the controller's database {db}, which only the "
            "controller's account and root may read (it holds every job's env values)",
            hint=hint)
    return Store(db, readonly=True)


def _owner(db: Path) -> str:
    """The account that owns the state directory (the controller's), for a `sudo -u` hint;
    'iadeep' (the account the docs install it as) when even that cannot be seen."""
    import pwd

    for path in (db, db.parent):
        try:
            return pwd.getpwuid(path.stat().st_uid).pw_name
        except (OSError, KeyError):
            continue
    return "iadeep"


def _hours(x: float) -> str:
    return f"{x:.1f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _kwh(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _print_table(rep: accounting.Report) -> None:
    from ..jobs import FINISHED
    from ..store import report as accounting

    states = [s.value for s in accounting.STATES if s in FINISHED or rep.running]
    what = "ended" + (" (and running now)" if rep.running else "")
    print(f"jobs that {what} from {clock(rep.since)} to {clock(rep.until)}")
    headers = [rep.by or "", "jobs", *states, "GPU-h", "wait p50", "wait p95",
               "work", "busy", "saved", "impact", "measured", "sharing", "kWh"]
    groups = [*rep.groups, rep.total]
    rows = [[g.key, g.jobs, *(g.states.get(s, 0) for s in states), _hours(g.gpu_hours),
             duration(g.wait_p50_s), duration(g.wait_p95_s), _hours(g.work_gpu_hours),
             _hours(g.busy_gpu_hours), f"{g.saved_gpu_hours:+.1f}", _ratio(g.impact_factor),
             _share(g.measured_share), _ratio(g.sharing_speed), _kwh(g.energy_kwh)]
            for g in groups]
    render.table(headers, rows)
    print("work: exclusive-GPU-hours done (speed x GPUs x time); busy: their share of the busy "
          "GPUs' hours; impact = work / busy; sharing: mean speed while sharing a GPU")


def _print_csv(rep: accounting.Report) -> None:
    import csv

    from ..store import report as accounting

    writer = csv.writer(sys.stdout, lineterminator="\n")
    states = [s.value for s in accounting.STATES]
    extra = ["work_gpu_hours", "busy_gpu_hours", "saved_gpu_hours", "impact_factor",
             "measured_share", "sharing_gpu_hours", "sharing_speed", "energy_kwh"]
    writer.writerow([rep.by or "group", "jobs", *states, "gpu_hours", "wait_p50_s",
                     "wait_p95_s", "predicted_speed", "observed_speed",
                     "jobs_with_predicted_speed", "jobs_with_observed_speed", *extra])
    for g in [*rep.groups, rep.total]:
        d = g.to_dict()
        writer.writerow([render.clean(g.key), g.jobs, *(g.states.get(s, 0) for s in states),
                         d["gpu_hours"], _blank(d["wait_p50_s"]), _blank(d["wait_p95_s"]),
                         _blank(d["predicted_speed"]), _blank(d["observed_speed"]),
                         g.with_predicted, g.with_observed,
                         *(_blank(d[k]) for k in extra)])


def _blank(x: float | None) -> object:
    return "" if x is None else x


def _as_dict(rep: accounting.Report) -> dict:
    from ..store import report as accounting

    return accounting.report_to_dict(rep)


@app.command("report")
def report(
    since: str = typer.Option("7d", "--since", help="Start of the window: 7d, 12h, 2026-11-01."),
    until: str = typer.Option("now", "--until", help="End of the window (same forms)."),
    by: str = typer.Option(None, "--by", help="One line per user, workload, node or day."),
    user: str = typer.Option(None, "--user", help="Only this user's jobs."),
    running: bool = typer.Option(False, "--running",
                                 help="Also jobs running now (their GPU time up to now)."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
    csv_: bool = typer.Option(False, "--csv", help="Print CSV."),
    plot: str = typer.Option(None, "--plot", metavar="FILE.png",
                             help="Also draw GPU-hours and impact factor per day into FILE.png."),
) -> None:
    """Accounting for finished jobs: jobs by final state, GPU-hours, queue wait, work done in
    exclusive-GPU-hours, GPU-hours saved, impact factor, speed while sharing, energy.

    Reads the controller's database read-only (works while it is down) as its account or root;
    others get it from the controller: admins the lab's, members their own jobs'.
    """
    now = time.time()
    start, end = parse_time(since, "--since", now), parse_time(until, "--until", now)
    if start >= end:
        raise InputError(f"--since {since!r} is not before --until {until!r}",
                         hint="the window is [since, until)")
    if by is not None and by not in GROUPINGS:
        raise InputError(f"--by {by[:40]!r} is not one of {', '.join(GROUPINGS)}",
                         hint="e.g. --by user")
    if json_ and csv_:
        raise InputError("--json and --csv are two outputs; give one", hint="e.g. --csv")
    if plot is not None:
        plot = _plot_target(plot)
    from ..store import report as accounting

    try:
        store = open_database()
    except PermissionDenied as private:
        rep, daily = _from_controller(private, start, end, by, user, running, plot is not None)
    else:
        try:
            with store.tx() as conn:
                rep = accounting.report(conn, start, end, by=by, user=user, running=running,
                                        now=now)
                daily = rep if by == "day" or plot is None else accounting.report(
                    conn, start, end, by="day", user=user, running=running, now=now)
        finally:
            store.close()
    if plot is not None:
        _draw(daily, plot)
        sys.stdout.flush()   # the table first, then where the plot went
        print(f"plot written to {plot}", file=sys.stderr)
    if json_:
        render.as_json(_as_dict(rep))
    elif csv_:
        _print_csv(rep)
    else:
        _print_table(rep)


def _from_controller(private: PermissionDenied, start: float, end: float, by: str | None,
                     user: str | None, running: bool, plot: bool
                     ) -> tuple[accounting.Report, accounting.Report]:
    """The report from the controller, for an account that may not read its database: the
    whole lab's for admins, the caller's own jobs' for other members (said on stderr)."""
    from ..errors import ControllerUnavailable
    from ..store import report as accounting
    from .lazy import client, messages as m

    request = m.ReportRequest(start, end, by=by, owner=user, running=running or None,
                              daily=(plot and by != "day") or None)
    try:
        reply = client.ask(request)
    except ControllerUnavailable:
        raise PermissionDenied(private.message + "; the controller, which reports to admins "
                               "and members, is not running either",
                               hint=private.hint) from None
    rep = accounting.report_from_dict(reply["report"])
    if reply.get("only"):
        print(f"note: from the controller: only {reply['only']}'s own jobs (lab admins see "
              "everyone's)", file=sys.stderr)
    return rep, rep if reply.get("daily") is None else \
        accounting.report_from_dict(reply["daily"])


def _plot_target(path: str) -> str:
    """``--plot``'s file, checked before any work: a .png in a directory that exists."""
    target = os.path.abspath(os.path.expanduser(path))
    if not target.lower().endswith(".png"):
        raise InputError(f"--plot {path[:60]!r} is not a .png file name", hint="e.g. --plot "
                         "usage.png")
    folder = os.path.dirname(target)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise InputError(f"--plot {path[:60]!r}: cannot write into {folder}",
                         hint="give a file in a directory you may write to")
    return target


def _draw(daily: accounting.Report, target: str) -> None:
    """GPU-hours (used, busy, work) and the impact factor per day, into ``target``.
    matplotlib is imported only here (the ``plot`` extra): every other report stays light."""
    plt = pyplot()

    days = [g.key for g in daily.groups]
    x = range(len(days))
    fig, hours = plt.subplots(figsize=(max(6.0, 0.35 * len(days) + 3), 4.5))
    width = 0.28
    hours.bar([i - width for i in x], [g.gpu_hours for g in daily.groups], width,
              label="GPU-hours held")
    hours.bar(list(x), [g.busy_gpu_hours for g in daily.groups], width,
              label="busy GPU-hours")
    hours.bar([i + width for i in x], [g.work_gpu_hours for g in daily.groups], width,
              label="work (exclusive-GPU-hours)")
    hours.set_ylabel("GPU-hours")
    hours.set_xticks(list(x), days, rotation=60, ha="right", fontsize=8)
    impact = hours.twinx()
    factors = [g.impact_factor for g in daily.groups]
    impact.plot([i for i, f in zip(x, factors) if f is not None],
                [f for f in factors if f is not None], "o-", color="black",
                label="impact factor")
    impact.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    impact.set_ylabel("impact factor (work / busy)")
    handles = hours.get_legend_handles_labels()[0] + impact.get_legend_handles_labels()[0]
    fig.legend(handles, [str(h.get_label()) for h in handles], loc="lower center", ncol=4,
               fontsize=8, frameon=False)
    hours.set_title(f"GPU-hours and impact factor per day\n{clock(daily.since)} to "
                    f"{clock(daily.until)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))   # room for the legend below
    save_plot(fig, target, dpi=100)

"""`iadeep reserve ...`: keep GPUs for a user over a window of time (admins add and delete)."""
from __future__ import annotations

import time

import typer

from ..errors import InputError
from ..text import DURATION_FORMS, clock, duration, parse_duration, parse_moment
from . import render
from .lazy import client, messages as m

app = typer.Typer(help="Reserve GPUs for a user over a window (admins).", no_args_is_help=True)


@app.command("add")
def add(user: str = typer.Option(..., "--user", "-u", help="Whose jobs may use the GPUs."),
        gpus: int = typer.Option(1, "--gpus", "-g", help="How many GPUs (on one node)."),
        node: str | None = typer.Option(None, "--node", help="On this node (default: the "
                                        "node the scheduler finds most free)."),
        start: str = typer.Option("now", "--start", metavar="WHEN",
                                  help="When it begins: 2026-12-10T09:00 (local time unless "
                                       "it names a zone, e.g. +01:00) or now."),
        length: str = typer.Option(..., "--duration", metavar="LENGTH",
                                   help="How long: 8h, 2d, 90m, 1d12h, 2:00:00.")) -> None:
    """Keep GPUs free for USER's jobs from --start for --duration: other users' jobs do not
    start on them if their time limit would reach into that window. Prints its id."""
    now = time.time()
    begin = parse_moment(start, now)
    if begin is None:
        raise InputError(f"--start {start!r} is not a date and time",
                         hint="e.g. --start 2026-12-10T09:00, or --start now")
    seconds = parse_duration(length, None)
    if not seconds:
        raise InputError(f"--duration {length!r} is not a length of time",
                         hint=f"e.g. 8h; the forms: {DURATION_FORMS}")
    r = client.ask(m.ReserveAddRequest(for_user=user, gpus=gpus, node=node, start=begin,
                                       end=begin + seconds))
    print(f"reservation {r.id}: {_line(r)}")


def _line(r: m.ReservationView) -> str:
    where = f" on {r.node}" if r.node else ""
    return (f"{r.gpus} GPU(s){where} for {r.user} from {clock(r.start)} for "
            f"{duration(r.end - r.start)}")


@app.command("list")
def list_(json_: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
          ) -> None:
    """List the reservations not over yet, and the GPUs each holds now."""
    found = client.ask(m.ReserveListRequest())
    if json_:
        render.as_json(m.encode(found))
        return
    now = time.time()
    render.table(["ID", "USER", "GPUS", "NODE", "START", "END", "HOLDS", "BY"],
                 [[str(r.id), r.user, str(r.gpus), r.node or "-", clock(r.start),
                   clock(r.end) + (" (now)" if r.start <= now else ""),
                   ",".join(r.held) or "-", r.created_by] for r in found])


@app.command("delete")
def delete(reservation_id: int = typer.Argument(..., metavar="ID",
                                                help="The reservation's id (reserve list).")
           ) -> None:
    """Delete a reservation: its GPUs are anyone's again."""
    r = client.ask(m.ReserveDeleteRequest(reservation_id))
    print(f"deleted reservation {r.id} ({_line(r)})")

"""`iadeep profile list|show`: the workload profiles the scheduler predicts interference from."""
from __future__ import annotations

import typer

from ..errors import NotFoundError
from ..model.catalog import known_profiles
from . import render

app = typer.Typer(help="Workload profiles (solo GPU behaviour) known to the scheduler.",
                  no_args_is_help=True)


def _num(v) -> str:
    return "-" if v is None else f"{v:.1f}"


@app.command("list")
def list_(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List every known workload label (use one with `queue add --workload`)."""
    rows = known_profiles()
    if json_:
        render.as_json(rows)
        return
    render.table(["WORKLOAD", "GPU", "GPU%", "MEM%", "PEAK GiB", "POWER W", "SOURCE"],
                 ([p["workload"], p["gpu_model"], _num(p["gpu_util"]), _num(p["mem_util"]),
                   _num(p["peak_mem_gib"]), _num(p["power_w"]), p["source"]] for p in rows))


@app.command("show")
def show(label: str = typer.Argument(..., help="Workload label."),
         json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show one profile's every field."""
    found = [p for p in known_profiles() if p["workload"] == label]
    if not found:
        names = ", ".join(p["workload"] for p in known_profiles())
        raise NotFoundError(f"no profile named {label!r}", hint=f"known: {names}")
    if json_:
        render.as_json(found[0])
        return
    for key, value in found[0].items():
        print(f"{key:>14}: {'-' if value is None else value}")

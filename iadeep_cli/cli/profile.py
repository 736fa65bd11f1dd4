"""`iadeep profile list|show|pin|unpin`: the workload profiles the scheduler predicts from."""
from __future__ import annotations

import typer

from ..controller import client
from ..errors import NotFoundError
from ..text import clock, when
from . import render

app = typer.Typer(help="Workload profiles (solo GPU behaviour) known to the scheduler.",
                  no_args_is_help=True)
LABEL = typer.Argument(..., help="Workload label.")


def _num(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _source(p: dict) -> str:
    return p["source"] + (f"; pinned by {p['pinned_by']}" if p["pinned_by"] else "")


def _verdict(sample: dict) -> str:
    word = "kept" if sample["accepted"] else "REJECTED"
    return f"{word}: {sample['note']}" if sample["note"] else word


@app.command("list")
def list_(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List every known workload label (use one with `queue add --workload`)."""
    rows, stale = client.read("profiles")
    if json_:
        render.as_json(rows)
        return
    render.stale_note(stale)
    render.table(["WORKLOAD", "GPU", "GPU%", "MEM%", "PEAK GiB", "POWER W", "SOURCE"],
                 ([p["workload"], p["gpu_model"], _num(p["gpu_util"]), _num(p["mem_util"]),
                   _num(p["peak_mem_gib"]), _num(p["power_w"]), _source(p)] for p in rows))


@app.command("show")
def show(label: str = LABEL,
         json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show one profile's every field and the job samples it was learnt from."""
    rows, stale = client.read("profiles")
    found = [p for p in rows if p["workload"] == label]
    if not found:
        names = ", ".join(p["workload"] for p in rows)
        raise NotFoundError(f"no profile named {label!r}", hint=f"known: {names}")
    profile = found[0]
    if json_:
        render.as_json(profile)
        return
    render.stale_note(stale)
    for key, value in profile.items():
        if key in ("updated_at", "pinned_at"):
            value = when(value)
        if key != "samples":
            print(f"{key:>14}: {'-' if value is None else value}")
    print("samples (newest first):")
    render.table(["TIME", "JOB", "USER", "GPU", "GPU%", "MEM%", "PEAK GiB", "VERDICT"],
                 ([clock(s["at"]),
                   s["job"] or "-", s["user"] or "-", s["gpu_model"], _num(s["gpu_util"]),
                   _num(s["mem_util"]), _num(s["peak_mem_gib"]), _verdict(s)]
                  for s in profile["samples"]))


@app.command("pin")
def pin(label: str = LABEL) -> None:
    """Freeze a profile: learning never changes it (admins only)."""
    client.call("profile_pin", {"label": label})
    print(f"profile {label}: pinned")


@app.command("unpin")
def unpin(label: str = LABEL) -> None:
    """Let learning from jobs change a profile again (admins only)."""
    client.call("profile_unpin", {"label": label})
    print(f"profile {label}: learns from jobs again")

"""`iadeep profile list|show|pin|unpin|pairs|pair-adopt|pair-remove`: the workload profiles and
co-location rows the scheduler predicts from."""
from __future__ import annotations

import typer

from ..errors import NotFoundError
from ..jobs import label_origin
from ..text import clock, when
from . import complete, render
from .lazy import client, messages as m

app = typer.Typer(help="Workload profiles (solo GPU behaviour) known to the scheduler.",
                  no_args_is_help=True)
LABEL = typer.Argument(..., help="Workload label.", autocompletion=complete.workloads)


def _num(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _source(p: m.ProfileView) -> str:
    return p.source + (f"; pinned by {p.pinned_by}" if p.pinned_by else "")


def _verdict(sample: m.ProfileSample) -> str:
    word = "kept" if sample.accepted else (
        "HELD" if (sample.note or "").startswith("held as") else "REJECTED")
    return f"{word}: {sample.note}" if sample.note else word


@app.command("list")
def list_(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List every known workload label (use one with `queue add --workload`)."""
    views, stale = client.read(m.ProfilesRequest())
    render.stale_note(stale)   # on stderr: --json's stdout stays JSON
    if json_:
        render.as_json(m.encode(views))
        return
    render.table(["WORKLOAD", "GPU", "GPU%", "MEM%", "PEAK GiB", "POWER W", "SOURCE"],
                 ([v.profile.workload, v.profile.gpu_model, _num(v.profile.gpu_util),
                   _num(v.profile.mem_util), _num(v.profile.peak_mem_gib),
                   _num(v.profile.power_w), _source(v)] for v in views))


@app.command("show")
def show(label: str = LABEL,
         json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show one profile's every field and the job samples it was learnt from."""
    views, stale = client.read(m.ProfilesRequest())
    found = [v for v in views if v.profile.workload == label]
    if not found:
        names = ", ".join(v.profile.workload for v in views)
        raise NotFoundError(f"no profile named {label!r}", hint=f"known: {names}")
    view = found[0]
    render.stale_note(stale)   # on stderr: --json's stdout stays JSON
    if json_:
        render.as_json(m.encode(view))
        return
    for key, value in m.encode(view).items():   # every field, as the JSON names it
        if key in ("updated_at", "pinned_at"):
            value = when(value)
        if key != "samples":
            print(f"{key:>14}: {'-' if value is None else value}")
    print(f"{'label':>14}: {label_origin(view.profile.workload)}")
    print("samples (newest first):")
    render.table(["TIME", "JOB", "USER", "GPU", "GPU%", "MEM%", "PEAK GiB", "VERDICT"],
                 ([clock(s.at), s.job or "-", s.owner or "-", s.gpu_model, _num(s.gpu_util),
                   _num(s.mem_util), _num(s.peak_mem_gib), _verdict(s)]
                  for s in view.samples))


@app.command("pin")
def pin(label: str = LABEL,
        adopt: str = typer.Option(None, "--adopt", metavar="USER",
                                  help="First make USER's held phase profile the lab's.")
        ) -> None:
    """Freeze a profile: learning never changes it (admins only)."""
    client.ask(m.ProfilePinRequest(label, adopt))
    print(f"profile {label}: " + (f"{adopt}'s phase profile adopted and pinned" if adopt
                                  else "pinned"))


@app.command("unpin")
def unpin(label: str = LABEL) -> None:
    """Let learning from jobs change a profile again (admins only)."""
    client.ask(m.ProfileUnpinRequest(label))
    print(f"profile {label}: learns from jobs again")


PAIR_IDS = typer.Argument(..., help="One or more row ids (`iadeep profile pairs` lists them).")


def _pair_rows(rows: list[m.ColocationView]) -> None:
    render.table(["ID", "GPU", "WORKLOADS", "SPEEDS", "STATE", "REPORTED BY", "TIME", "NOTE"],
                 ([r.id, r.gpu_model or "-", " + ".join(r.workloads),
                   " / ".join(f"{s:.2f}" for s in r.speeds),
                   "lab" if r.kind == "lab" else "HELD", ", ".join(r.owners) or "-",
                   clock(r.observed_at), r.note or "-"] for r in rows))


@app.command("pairs")
def pairs(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the lab's co-location rows: the lab's (the model and self-tuning learn from them)
    and those HELD as one member's until another member's jobs agree (admins only)."""
    rows = client.ask(m.PairsRequest())
    if json_:
        render.as_json(m.encode(rows))
        return
    _pair_rows(rows)


@app.command("pair-adopt")
def pair_adopt(ids: list[int] = PAIR_IDS) -> None:
    """Make HELD co-location rows the lab's: the model's next refit and self-tuning use them
    (admins only)."""
    _pair_rows(client.ask(m.PairsAdoptRequest(tuple(ids))))


@app.command("pair-remove")
def pair_remove(ids: list[int] = PAIR_IDS) -> None:
    """Remove co-location rows, held or the lab's: the model's next refit goes without them
    (admins only)."""
    rows = client.ask(m.PairsRemoveRequest(tuple(ids)))
    print(f"removed {len(rows)} co-location row{'s' if len(rows) != 1 else ''}: "
          + ", ".join(str(r.id) for r in rows))

"""`iadeep controller run`: the long-running process that owns the queue."""
from __future__ import annotations

from typing import Optional

import typer

from .. import paths

app = typer.Typer(help="Run the controller (the only writer of scheduling state).",
                  no_args_is_help=True)


@app.command("run")
def run(inventory: Optional[str] = typer.Option(
        None, "--inventory", "-i", help="nodes.yaml (default: $IADEEP_INVENTORY, then the "
                                         "state directory's nodes.yaml)."),
        new_database: bool = typer.Option(
            False, "--new-database", help="Start with an empty database although this state "
                                          "directory had one (its jobs are forgotten).")) -> None:
    """Run the controller in the foreground until SIGINT/SIGTERM."""
    from ..controller.runtime import run_forever
    from ..inventory import load_inventory

    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    inv = load_inventory(inventory, missing_ok=True)
    source = inv.path or "no inventory (empty cluster)"

    def ready() -> None:
        print(f"iadeep controller: {len(inv.nodes)} nodes from {source}; "
              f"listening on {paths.socket_path()}", flush=True)

    run_forever(inv, on_ready=ready, new_database=new_database)

"""`iadeep controller run` (the long-running process that owns the queue) and `reload`."""
from __future__ import annotations

import typer

app = typer.Typer(help="Run the controller (the only writer of scheduling state); reload its "
                       "inventory.",
                  no_args_is_help=True)


def _log_lab_events() -> None:
    """iadeep's own events (job transitions, nodes, start and stop) at INFO; libraries only
    from WARNING (paramiko alone logs two INFO lines per SFTP read, i.e. every poll)."""
    import logging

    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("iadeep").setLevel(logging.INFO)


@app.command("run")
def run(inventory: str | None = typer.Option(
        None, "--inventory", "-i", help="nodes.yaml (default: $IADEEP_INVENTORY, then the "
                                         "state directory's nodes.yaml)."),
        new_database: bool = typer.Option(
            False, "--new-database", help="Start with an empty database although this state "
                                          "directory had one (its jobs are forgotten)."),
        metrics: str | None = typer.Option(
            None, "--metrics", metavar="HOST:PORT",
            help="Serve Prometheus metrics there, e.g. 127.0.0.1:9464 (default: "
                 "lab.metrics.listen, else off; an address other than loopback needs "
                 "lab.metrics.allow_remote: true).")) -> None:
    """Run the controller in the foreground until SIGINT/SIGTERM (SIGHUP: reload)."""
    from ..controller.runtime import run_forever
    from ..inventory import load_inventory
    from ..settings import metrics_address

    inv = load_inventory(inventory)
    listen = metrics_address(inv.metrics, metrics)
    _log_lab_events()
    run_forever(inv, new_database=new_database, metrics=listen)


@app.command("reload")
def reload() -> None:
    """Re-read the running controller's inventory file (admins only; same as SIGHUP).

    The file is checked first: with an error it is refused and nothing changes. Running jobs
    keep running; jobs on a node no longer listed are marked lost."""
    from .. import messages as m
    from ..controller import client

    result = client.ask(m.ReloadRequest())
    if result.pending:
        print(f"reload of {result.path} accepted; it applies when the current scheduling "
              "round ends")
        return
    print(f"reloaded {result.path}: {result.summary}")

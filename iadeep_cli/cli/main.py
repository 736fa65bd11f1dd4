"""``iadeep``: every command group registered on the root app, and the entry point.

Command modules are imported here, but heavy libraries (paramiko, numpy, scipy, textual) are
imported only inside the commands that need them, so `iadeep status` and `iadeep queue list`
stay fast. Groups are added with add_typer; status, logs, report, sim and monitor decorate the
root app directly (this import order is --help's order).
"""
from __future__ import annotations

import typer

from . import (  # noqa: F401  (they register on `app`)
    controller,
    logs,
    model,
    monitor,
    nodes,
    profile,
    queue,
    report,
    reserve,
    run,
    sim,
    status,
    tune,
    web,
)
from .errors import run as run_app
from .root import app

app.add_typer(queue.app, name="queue")
app.add_typer(controller.app, name="controller")
app.add_typer(model.app, name="model")
app.add_typer(nodes.app, name="nodes")
app.add_typer(profile.app, name="profile")
app.add_typer(reserve.app, name="reserve")


def version() -> str:
    """The installed distribution's version (what pip and pipx installed); the package's own
    ``__version__`` (the same number, pyproject.toml takes it from there) when run from a
    source tree that was never installed."""
    from importlib import metadata
    try:
        return metadata.version("iadeep")
    except metadata.PackageNotFoundError:
        from .. import __version__
        return __version__


def _print_version(wanted: bool) -> None:
    if wanted:
        print(f"iadeep {version()}")
        raise typer.Exit()


@app.callback()
def _options(_version: bool = typer.Option(False, "--version", is_eager=True,
                                            callback=_print_version,
                                            help="Print iadeep's version and exit.")) -> None:
    pass


def main() -> None:
    run_app(app)

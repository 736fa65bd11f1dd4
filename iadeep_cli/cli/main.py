"""``iadeep``: the top-level typer app; each command group lives in its own module.

Groups are imported here, but heavy libraries (paramiko, scikit-learn, textual) are imported
only inside the commands that need them, so `iadeep status` and `iadeep queue list` stay fast.
"""
from __future__ import annotations

import typer

from .errors import run

app = typer.Typer(
    help="iadeep: interference-aware GPU scheduling for a small lab's servers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    from . import groups  # noqa: F401  (each command module registers itself on `app`)

    run(app)

"""The top-level typer app. Command modules register on it; ``cli.main`` imports them all.

A module of its own so that commands and ``main`` both import it and never each other.
Completion is on (``iadeep --install-completion``): a lab coming from Slurm has it for sbatch.
"""
from __future__ import annotations

import typer

app = typer.Typer(
    help="iadeep: interference-aware GPU scheduling for a small lab's servers.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Markdown: a docstring's single line breaks (wrapped at the source's width) join, so help
    # rewraps to the terminal instead of breaking mid-sentence at 80 columns
    rich_markup_mode="markdown",
)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"iadeep {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version,
                                       is_eager=True, help="Print iadeep's version and exit.")
          ) -> None:
    """iadeep: interference-aware GPU scheduling for a small lab's servers."""

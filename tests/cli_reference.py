"""The command reference (docs/reference/cli.md), generated from the CLI itself.

typer's own generator (``typer iadeep_cli.cli.main utils docs``) writes every command, argument
and option with its help text; the first line records the typer version that wrote it, since
another version words the same CLI differently. ``make cli-reference`` rewrites the file;
tests/unit/test_docs.py regenerates it in a temporary directory and fails when the checked-in
file differs.

    .venv/bin/python tests/cli_reference.py docs/reference/cli.md
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "reference" / "cli.md"
COMMAND = "make cli-reference"


def header(version: str) -> str:
    return (f"<!-- generated from the CLI by `{COMMAND}` (typer {version}); "
            "do not edit by hand -->\n\n")


def recorded_version(text: str) -> str | None:
    """The typer version the first line of a generated reference names, if any."""
    first = text.split("\n", 1)[0]
    marker = "(typer "
    if marker not in first:
        return None
    return first.split(marker, 1)[1].split(")", 1)[0]


def generate(out: Path) -> None:
    """Write the reference to ``out`` with this environment's typer."""
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_name(out.name + ".raw")
    subprocess.run([sys.executable, "-m", "typer", "iadeep_cli.cli.main", "utils", "docs",
                    "--name", "iadeep", "--output", str(raw)],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    body = raw.read_text()
    raw.unlink()
    out.write_text(header(typer.__version__) + body.rstrip("\n") + "\n")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else REFERENCE)

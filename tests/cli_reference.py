"""The command reference (docs/reference/cli.md), generated from the CLI itself.

typer's own generator (``typer iadeep_cli.cli.main utils docs``) writes every command, argument
and option with its help text; the first line records the typer version that wrote it, since
another version words the same CLI differently. ``make cli-reference`` rewrites the file.
tests/unit/test_docs.py checks it two ways: with any typer, the commands, arguments and options
the file lists must be the CLI's (``outline_of_reference`` against ``outline_of_cli``); with the
typer that wrote it, it regenerates the file in a temporary directory and the text must match.

    .venv/bin/python tests/cli_reference.py docs/reference/cli.md
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

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


UNLISTED = {"--help", "--install-completion", "--show-completion"}


def outline_of_reference(text: str) -> dict[str, dict[str, set[str]]]:
    """Per command heading (``iadeep queue add``): its arguments, option flags and subcommands
    as a generated reference lists them, the wording left out (it changes between typer
    versions; the commands and options do not)."""
    outline: dict[str, dict[str, set[str]]] = {}
    command = section = None
    for line in text.splitlines():
        heading = re.fullmatch(r"#+ `(iadeep[^`]*)`", line)
        if heading:
            command = heading.group(1)
            outline[command] = {"arguments": set(), "options": set(), "commands": set()}
            section = None
            continue
        label = re.fullmatch(r"\*\*(Arguments|Options|Commands)\*\*:", line)
        if label:
            section = label.group(1).lower()
            continue
        item = re.match(r"\* `([^`]+)`", line)
        if command is None or section is None or not item:
            continue
        if section == "options":
            outline[command]["options"] |= set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*",
                                                          item.group(1))) - UNLISTED
        elif section == "arguments":
            outline[command]["arguments"].add(_argument(item.group(1)))
        else:
            outline[command]["commands"].add(item.group(1))
    return outline


def outline_of_cli() -> dict[str, dict[str, set[str]]]:
    """The same outline read from the CLI itself (click's command tree), hidden parts left out
    as the generator leaves them out (and typer's own completion options, which it never
    lists)."""
    from iadeep_cli.cli.main import app

    outline: dict[str, dict[str, set[str]]] = {}

    def walk(cmd: Any, path: str) -> None:   # typer's click (its own copy since typer 0.26)
        params = [p for p in cmd.params if not getattr(p, "hidden", False)]
        subs = {name: sub for name, sub in getattr(cmd, "commands", {}).items()
                if not sub.hidden}
        outline[path] = {
            "arguments": {_argument(p.metavar or p.name or "") for p in params
                          if p.param_type_name == "argument"},
            "options": {o for p in params if p.param_type_name == "option"
                        for o in (*p.opts, *p.secondary_opts)} - UNLISTED,
            "commands": set(subs)}
        for name, sub in subs.items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "iadeep")
    return outline


def _argument(name: str) -> str:
    return name.removesuffix("...").strip().lower()


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

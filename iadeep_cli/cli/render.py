"""Plain-text rendering shared by the commands (no rich: it would slow every start-up)."""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Sequence

from ..checks import (
    escape as safe,  # what users typed, made printable
    escaped as clean,  # noqa: F401  (used by the commands as render.clean)
)
from ..paths import SET_IADEEP_HOME, iadeep_home_set
from ..snapshot import json_safe
from ..text import cells, duration, pad


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], out=None) -> None:
    """Left-aligned columns sized to their content (made ``safe``); the last column is never
    padded."""
    out = out or sys.stdout
    text = [["-" if c is None else safe(str(c)) for c in row] for row in rows]
    # widths in terminal cells, not characters: a CJK job name takes two cells a character
    widths = [max([cells(h)] + [cells(r[i]) for r in text]) for i, h in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        padded = [pad(c, w) for c, w in zip(row[:-1], widths[:-1])] + [row[-1]]
        return "  ".join(padded).rstrip()

    print(line(list(headers)), file=out)
    for row in text:
        print(line(row), file=out)


def as_json(data: object) -> None:
    """Standard JSON only: non-finite numbers print as null."""
    print(json.dumps(json_safe(data), indent=2, sort_keys=False, allow_nan=False))


def stale_note(stale_since: float | None) -> None:
    """If the controller is down, say so and how old the data shown is (on stderr)."""
    if stale_since is None:
        return
    if stale_since:
        age = f"last heartbeat {duration(time.time() - stale_since)} ago"
    elif iadeep_home_set():
        age = "it has never run here"
    else:   # a member looking in their own default directory, where no lab's controller is
        age = f"it has never run in your default state directory: {SET_IADEEP_HOME}"
    print(f"note: the controller is not running; showing the last recorded state ({age})",
          file=sys.stderr)

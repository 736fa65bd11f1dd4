"""Plain-text rendering shared by the commands (no rich: it would slow every start-up)."""
from __future__ import annotations

import json
import sys
import time
from typing import Iterable, Sequence

from ..checks import escape as safe, escaped as clean   # what users typed, made printable


def duration(seconds: float | None) -> str:
    """Short human duration: 42s, 5m, 3h12m, 2d4h."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def when(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "-"
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    return f"{local} ({duration((now or time.time()) - ts)} ago)"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], out=None) -> None:
    """Left-aligned columns sized to their content (made ``safe``); the last column is never
    padded."""
    out = out or sys.stdout
    rows = [["-" if c is None else safe(str(c)) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) for c, w in zip(cells[:-1], widths[:-1])] + [cells[-1]]
        return "  ".join(padded).rstrip()

    print(line(list(headers)), file=out)
    for row in rows:
        print(line(row), file=out)


def as_json(data: object) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def stale_note(stale_since: float | None) -> None:
    """If the controller is down, say so and how old the data shown is (on stderr)."""
    if stale_since is None:
        return
    age = (f"last heartbeat {duration(time.time() - stale_since)} ago" if stale_since
           else "it has never run here")
    print(f"note: the controller is not running; showing the last recorded state ({age})",
          file=sys.stderr)

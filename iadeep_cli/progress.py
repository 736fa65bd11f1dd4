"""Training-progress reporting: a job appends ``<unix_time> <iterations_done>`` lines to a file,
optionally ``<unix_time> <iterations_done> <iterations_total>``: with the total, the controller
also forecasts when the job ends (``scheduler/forecast.py``).

Stdlib only, so a training script on a node can import it cheaply (or copy the three lines of
``report``). The controller reads the file to measure a job's co-located speed online.
"""
from __future__ import annotations

import os
import time

ENV_VAR = "IADEEP_PROGRESS_FILE"


def report(iterations_done: int, path: str | None = None, total: int | None = None) -> None:
    """Append one progress line to ``path`` or $IADEEP_PROGRESS_FILE (no-op if neither is set);
    ``total``: the iterations the job will do in all, if it knows."""
    target = path or os.environ.get(ENV_VAR)
    if not target:
        return
    tail = f" {int(total)}" if total is not None and total > 0 else ""
    with open(target, "a", encoding="utf-8") as f:  # one short write: lines stay whole
        f.write(f"{time.time():.3f} {int(iterations_done)}{tail}\n")


def read_progress(path) -> list[tuple[float, int]]:
    """All well-formed lines; a partial last line (job writing right now) or junk is skipped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return parse_progress(text)


def parse_progress(text: str) -> list[tuple[float, int]]:
    """Progress lines from text (as read from a node); only complete, well-formed lines."""
    points = []
    for line in text.split("\n")[:-1] if not text.endswith("\n") else text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():   # with the total: read by parse_total
            parts = parts[:2]
        if len(parts) != 2:
            continue
        try:
            points.append((float(parts[0]), int(parts[1])))
        except ValueError:
            continue
    return points


def parse_total(text: str) -> int | None:
    """The iterations in all, from the last complete line that gives one (None: none does)."""
    lines = text.split("\n")[:-1] if not text.endswith("\n") else text.splitlines()
    for line in reversed(lines):
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit() and int(parts[2]) > 0:
            try:
                float(parts[0]), int(parts[1])
            except ValueError:
                continue
            return int(parts[2])
    return None


def rate(points, window_s: float | None = None) -> float | None:
    """Iterations per second over the last ``window_s`` seconds (all points if None)."""
    if window_s is not None and points:
        end = points[-1][0]
        points = [p for p in points if p[0] >= end - window_s]
    if len(points) < 2:
        return None
    (t0, i0), (t1, i1) = points[0], points[-1]
    if t1 <= t0 or i1 < i0:
        return None
    return (i1 - i0) / (t1 - t0)

"""Training-progress reporting: a job appends ``<unix_time> <iterations_done>`` lines to a file.

A job that knows how many iterations it will do in all may also append ``total <iterations>``
lines (the last one counts); a reader that predates them skips them as malformed, as every
reader skips lines it does not know. Stdlib only, so a training script on a node can import it
cheaply (or copy the three lines of ``report``). The controller reads the file to measure a
job's co-located speed online.
"""
from __future__ import annotations

import math
import os
import time

ENV_VAR = "IADEEP_PROGRESS_FILE"
# What a progress line may hold; any other line is that job's bad line, skipped like junk. A
# count is a non-negative integer below 2**63 (a 64-bit counter; at most 19 digits are even
# looked at), a time a finite Unix time in seconds between 1970 and the year 5138: nothing a
# job writes can make ``rate`` overflow, divide by nothing or give NaN or Infinity.
MAX_STEPS = 2**63 - 1
MAX_STEP_DIGITS = 19
MAX_TIME = 1e11


def report(iterations_done: int, path: str | None = None) -> None:
    """Append one progress line to ``path`` or $IADEEP_PROGRESS_FILE (no-op if neither is set)."""
    target = path or os.environ.get(ENV_VAR)
    if not target:
        return
    with open(target, "a", encoding="utf-8") as f:  # one short write: lines stay whole
        f.write(f"{time.time():.3f} {int(iterations_done)}\n")


def report_total(total_iterations: int, path: str | None = None) -> None:
    """Append ``total <iterations>`` (how many iterations the job will do in all) to ``path``
    or $IADEEP_PROGRESS_FILE (no-op if neither is set)."""
    target = path or os.environ.get(ENV_VAR)
    if not target:
        return
    with open(target, "a", encoding="utf-8") as f:
        f.write(f"total {int(total_iterations)}\n")


def parse_total(text: str) -> int | None:
    """The last complete ``total <iterations>`` line's count (None when there is none)."""
    lines = text.split("\n")[:-1]   # a last line without its newline is still being written
    for line in reversed(lines):
        parts = line.split()
        if len(parts) == 2 and parts[0] == "total":
            try:
                return int(parts[1])
            except ValueError:
                continue
    return None


def read_progress(path: str | os.PathLike[str]) -> list[tuple[float, int]]:
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
        point = parse_line(line)
        if point is not None:
            points.append(point)
    return points


def parse_line(line: str) -> tuple[float, int] | None:
    """(time, steps) of one well-formed progress line, or None: two fields, a finite time in
    [0, ``MAX_TIME``] and a step count of digits in [0, ``MAX_STEPS``]; anything else (a
    4,000-digit count, ``nan``, ``1e400``, a negative count) is a bad line."""
    parts = line.split()
    if len(parts) != 2 or len(parts[0]) > 32 or not parts[1].isascii() \
            or not parts[1].isdigit() or len(parts[1]) > MAX_STEP_DIGITS:
        return None
    try:
        at, steps = float(parts[0]), int(parts[1])
    except ValueError:
        return None
    if not (math.isfinite(at) and 0.0 <= at <= MAX_TIME) or steps > MAX_STEPS:
        return None
    return at, steps


def rate(points: list[tuple[float, int]], window_s: float | None = None) -> float | None:
    """Iterations per second over the last ``window_s`` seconds (all points if None)."""
    if window_s is not None and points:
        end = points[-1][0]
        points = [p for p in points if p[0] >= end - window_s]
    if len(points) < 2:
        return None
    (t0, i0), (t1, i1) = points[0], points[-1]
    if t1 <= t0 or i1 < i0:
        return None
    try:
        per_s = (i1 - i0) / (t1 - t0)
    except (OverflowError, ZeroDivisionError):   # points not from parse_progress
        return None
    return per_s if math.isfinite(per_s) else None

"""Training-progress reporting: a job appends ``<unix_time> <iterations_done>`` lines to a file.

A job that knows how many iterations it will do in all also appends ``total <iterations>``
lines (the last one counts); with the total the controller forecasts when the job ends
(``scheduler/forecast.py``). That is the canonical form, written by ``report(done, total=N)``
and ``report_total`` (and so by every framework hook): a reader that predates it skips the
``total`` line as junk and still reads every progress line. The reader also accepts a third
field on a progress line, ``<unix_time> <iterations_done> <iterations_total>`` (the form an
earlier draft wrote): its first two fields are a progress point, its third a total, and
``parse_total`` takes the last complete line that gives a total in either form. Stdlib only, so
a training script on a node can import it cheaply (or copy the lines of ``report``). The
controller reads the file to measure a job's co-located speed online.
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


def report(iterations_done: int, path: str | None = None, total: int | None = None) -> None:
    """Append one progress line to ``path`` or $IADEEP_PROGRESS_FILE (no-op if neither is set);
    ``total``: the iterations the job will do in all, if it knows."""
    target = path or os.environ.get(ENV_VAR)
    if not target:
        return
    tail = f"total {int(total)}\n" if total is not None and total > 0 else ""
    with open(target, "a", encoding="utf-8") as f:  # one short write: lines stay whole
        f.write(f"{time.time():.3f} {int(iterations_done)}\n{tail}")


def report_total(total_iterations: int, path: str | None = None) -> None:
    """Append ``total <iterations>`` (how many iterations the job will do in all) to ``path``
    or $IADEEP_PROGRESS_FILE (no-op if neither is set)."""
    target = path or os.environ.get(ENV_VAR)
    if not target:
        return
    with open(target, "a", encoding="utf-8") as f:
        f.write(f"total {int(total_iterations)}\n")


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
    [0, ``MAX_TIME``] and a step count of digits in [0, ``MAX_STEPS``], optionally a third, the
    total (read by ``parse_total``); anything else (a 4,000-digit count, ``nan``, ``1e400``, a
    negative count, a junk total) is a bad line."""
    parts = line.split()
    if len(parts) == 3 and _count(parts[2]) is not None:
        parts = parts[:2]
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


def _count(field: str) -> int | None:
    """A count field's value: ASCII digits, at most ``MAX_STEP_DIGITS`` of them, at most
    ``MAX_STEPS``; None for anything else."""
    if not field.isascii() or not field.isdigit() or len(field) > MAX_STEP_DIGITS:
        return None
    value = int(field)
    return value if value <= MAX_STEPS else None


def parse_total(text: str) -> int | None:
    """The iterations in all, from the last complete line that gives a positive one: a
    ``total <iterations>`` line or a progress line's third field (None when none does)."""
    lines = text.split("\n")[:-1]   # a last line without its newline is still being written
    for line in reversed(lines):
        parts = line.split()
        if len(parts) == 2 and parts[0] == "total":
            total = _count(parts[1])
        elif len(parts) == 3 and parse_line(line) is not None:
            total = _count(parts[2])
        else:
            continue
        if total:
            return total
    return None


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

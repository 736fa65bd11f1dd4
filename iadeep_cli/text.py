"""How values are written for people: durations, times, ages and GiB, one way everywhere.

The CLI, the monitor and the scheduler's wait reasons all show these; one module keeps
``iadeep status``, ``queue show`` and the monitor saying the same thing the same way.
Stdlib only (the fast commands import it); ``pyplot`` loads matplotlib only when a chart is
asked for.
"""
from __future__ import annotations

import re
import shlex
import time
import unicodedata
from collections.abc import Iterable

MIB_PER_GIB = 1024.0


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


_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WITH_UNITS = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")
_SLURM = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
# The one way durations are written, on the command line (--time, report's --since/--until)
# and in nodes.yaml alike; a bare number's unit is the one thing that differs (--time: minutes,
# as sbatch; nodes.yaml: seconds).
DURATION_FORMS = "8d, 12h, 30m, 90s, 1d12h, 2:00:00 (H:MM:SS) or 3-0 / 1-12:30 (D-HH[:MM[:SS]])"


def parse_duration(text: str, bare_s: float | None) -> float | None:
    """Seconds in ``text``: units (``8d``, ``12h``, ``30m``, ``90s``, ``2w``, ``1d12h``),
    sbatch's forms (``90:30`` M:S, ``2:00:00`` H:M:S, ``3-0``, ``1-12:30``, ``1-12:30:00``) or
    a bare number of ``bare_s`` seconds (None: a bare number is refused); None if none of
    these."""
    value = text.strip().lower()
    if _WITH_UNITS.fullmatch(value):
        return float(sum(float(n) * _UNITS_S[u]
                         for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhdw])", value)))
    m = _SLURM.fullmatch(value)
    if m is None:
        return None
    days, first, second, third = m.groups()
    numbers = [int(x) for x in (first, second, third) if x is not None]
    if days is not None:                     # D-H, D-H:M, D-H:M:S
        h, mi, sec = (*numbers, 0, 0)[:3]
        return float(int(days) * 86400 + h * 3600 + mi * 60 + sec)
    if len(numbers) == 1:
        return None if bare_s is None else float(numbers[0] * bare_s)
    if len(numbers) == 2:
        return float(numbers[0] * 60 + numbers[1])   # M:S
    return float(numbers[0] * 3600 + numbers[1] * 60 + numbers[2])   # H:M:S


def parse_moment(text: str, now: float) -> float | None:
    """Epoch seconds of ``text``: ``now``, or an ISO 8601 date and time (``2026-12-10T09:00``,
    ``2026-12-10 09:00``, ``2026-12-10``: midnight), local time unless it names a zone
    (``+01:00``, ``Z``); None if it is none of these."""
    import datetime

    value = text.strip()
    if value.lower() == "now":
        return now
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment.timestamp()   # a naive moment is local time


def gpus_at(node: str | None, indices: Iterable[int]) -> str:
    """A job's GPUs as people read them everywhere: ``node:0,1``."""
    return f"{node}:{','.join(str(i) for i in indices)}"


def hms(seconds: float | None) -> str:
    """A time limit as Slurm prints one: ``2:00:00``, ``3-00:00:00`` ('-' when none)."""
    if seconds is None:
        return "-"
    s = int(seconds)
    days, s = divmod(s, 86400)
    text = f"{s // 3600}:{(s % 3600) // 60:02d}:{s % 60:02d}"
    return f"{days}-{text.zfill(8)}" if days else text


def clock(ts: float | None) -> str:
    """A moment in local time, to the second ('-' when unknown)."""
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def hhmm(ts: float) -> str:
    """A moment of today as people say it in a sentence: ``14:02`` (local time)."""
    return time.strftime("%H:%M", time.localtime(ts))


def when(ts: float | None, now: float | None = None) -> str:
    """A moment and how long ago it was: ``2025-06-15 17:20:00 (5m ago)``."""
    if ts is None:
        return "-"
    return f"{clock(ts)} ({duration((now or time.time()) - ts)} ago)"


def gib(mib: float | None, *, compact: bool = False, unit: str = "") -> str:
    """MiB as GiB with one decimal ('?' when unknown); ``compact`` drops the decimal from 10 GiB
    on (the monitor's narrow cards), ``unit`` is appended (e.g. " GiB")."""
    if mib is None:
        return "?"
    value = mib / MIB_PER_GIB
    return (f"{value:.0f}" if compact and value >= 9.95 else f"{value:.1f}") + unit


def impact(factor: float | None, work_h: float, busy_h: float,
           measured_share: float | None) -> str:
    """An impact factor with what it is made of, for people (``store/impact.py`` defines it):
    '1.24 (work 3.7 on 3.0 busy GPU-h: 0.7 saved; 60% measured)'; '-' when no GPU was busy."""
    if factor is None:
        return "- (no GPU busy)"
    measured = "" if measured_share is None else f"; {measured_share:.0%} measured"

    def h(x: float, sign: str = "") -> str:   # two decimals under one GPU-hour
        return f"{x:{sign}.{1 if abs(x) >= 1 else 2}f}"
    return (f"{factor:.2f} (work {h(work_h)} on {h(busy_h)} busy GPU-h: "
            f"{h(work_h - busy_h, '+')} saved{measured})")


def pyplot():
    """matplotlib's pyplot drawing into files (no display), for ``--plot``: loaded only when a
    chart is asked for (the ``plot`` extra), so every other command stays light; a clear error
    when it is not installed."""
    from .errors import InputError

    try:
        import matplotlib
    except ImportError:
        raise InputError("--plot needs matplotlib, which is not installed",
                         hint="pip install 'iadeep[plot]' (or matplotlib)") from None
    matplotlib.use("Agg")   # no display: a file
    import matplotlib.pyplot as plt
    return plt


def save_plot(fig, path: str, dpi: int) -> None:
    """Write a ``pyplot()`` figure to ``path`` and free it; a path that cannot be written is
    one clear error, not a traceback."""
    from .errors import InputError

    try:
        fig.savefig(path, dpi=dpi)
    except OSError as exc:
        raise InputError(f"{path}: cannot write plot ({exc.strerror or exc})",
                         hint="choose a writable path for --plot") from None
    finally:
        pyplot().close(fig)


# --------------------------------------------------------------------------- job tables
# One formatter for the jobs tables of `queue list` and the monitor: how a job is labelled and
# how columns share the terminal's width.

def newest_runs(jobs) -> dict[tuple[int, int], int]:
    """(array id, index) -> the id of that task's newest run among ``jobs``."""
    out: dict[tuple[int, int], int] = {}
    for j in jobs:
        if j.array_id is not None and j.array_index is not None:
            key = (j.array_id, j.array_index)
            out[key] = max(out.get(key, j.id), j.id)
    return out


def job_label(job, newest: dict[tuple[int, int], int]) -> str:
    """A job as people name it: an array's task as ARRAY_INDEX (12_3, as in Slurm); an
    earlier run of a task that was run again (`queue rerun 12_3`) by its own id, so that only
    the run ``12_3`` names is labelled so (``newest``: ``newest_runs``)."""
    if job.array_id is None or job.array_index is None:
        return str(job.id)
    if newest.get((job.array_id, job.array_index), job.id) != job.id:
        return str(job.id)
    return f"{job.array_id}_{job.array_index}"


def cells(text: str) -> int:
    """How many terminal cells ``text`` takes: East Asian wide and fullwidth characters two
    (a CJK job name), combining marks none, the rest one (as wcwidth counts them)."""
    n = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        n += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return n


def pad(text: str, width: int) -> str:
    """``text`` padded with spaces to ``width`` cells (str.ljust counts characters)."""
    return text + " " * max(0, width - cells(text))


def shorten(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` cells, marked "..." where it was cut."""
    if cells(text) <= width:
        return text
    out, used = [], 0
    for ch in text:
        w = cells(ch)
        if used + w > max(0, width - 3):
            break
        out.append(ch)
        used += w
    return "".join(out) + "..."


def column_widths(headers, rows, columns: int, shrink: list[tuple[int, int]], gap: int = 2
                  ) -> list[int]:
    """Widths of a table's columns on a terminal ``columns`` wide: each as wide as its
    content, then, while the table is too wide, the steps of ``shrink`` in order, each
    (column, floor) narrowing that column down to at most ``floor``: a wide terminal cuts
    nothing, a narrow one cuts what matters least first."""
    widths = [max([cells(str(h))] + [cells(str(r[i])) for r in rows])
              for i, h in enumerate(headers)]
    for i, floor in shrink:
        over = sum(widths) + gap * (len(widths) - 1) - columns
        if over <= 0:
            break
        widths[i] = max(min(widths[i], max(floor, cells(str(headers[i])))), widths[i] - over)
    return widths


def field_text(name: str, value) -> str:
    """A job field as a person reads it (`queue show`, the monitor's details): '-' for
    nothing, yes/no, speeds to 2 decimals, the arguments and environment as they would be typed
    in a shell, lists comma-separated, never a Python value (None, False, [...])."""
    if value is None or (isinstance(value, (str, tuple, list, dict)) and not value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name == "time_limit_s":
        return hms(value)
    if name == "begin_at":   # --begin: a moment
        return clock(value)
    if name == "host_mem_mib":
        return f"{value}M"
    if isinstance(value, float):
        return f"{value:.2f}"
    if name == "args":
        return shlex.join(value)
    if name in ("env", "exported"):
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in dict(value).items())
    if name == "constraint":
        return "&".join(value)
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(getattr(value, "value", value))   # an enum (a job's state) by its value


def settings_label(settings) -> str:
    """One candidate of self-tuning in words: ``3/GPU, floor 0.3, threshold``."""
    k = settings["max_jobs_per_gpu"]
    if k == 1:
        return "1/GPU (exclusive)"
    return f"{k}/GPU, floor {settings['min_speed']:g}, {settings['sharing']}"


def foreign_idle_line(node: str, gpu: int, pid: int, name: str, mib: float | None,
                      for_s: float) -> str:
    """A GPU held idle by a process iadeep did not start (steps/foreign.py), as `status`
    and the admins' message say it: its executable's base name, control characters escaped."""
    base = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in name.rsplit("/", 1)[-1])[:60]
    what = ", ".join(x for x in (base, gib(mib, unit=" GiB") if mib else "") if x)
    return (f"{node}:{gpu} held idle by pid {pid}{f' ({what})' if what else ''} for "
            f"{duration(for_s)}, not an iadeep job")


def moment(ts: float, now: float) -> str:
    """A moment as a sentence says it: ``14:20`` today, ``Fri 09:10`` within a week, else
    ``2026-12-24 09:10`` (local time)."""
    day = time.localtime(ts)
    if time.strftime("%Y-%m-%d", day) == time.strftime("%Y-%m-%d", time.localtime(now)):
        return time.strftime("%H:%M", day)
    if abs(ts - now) < 6 * 86400:
        return time.strftime("%a %H:%M", day)
    return time.strftime("%Y-%m-%d %H:%M", day)


def forecast_text(start: float | None, low: float | None, high: float | None,
                  end: float | None, now: float, *, where: str = "",
                  beside: tuple[int, ...] = (), speed: float | None = None,
                  waiting: bool = True) -> str:
    """The forecast as a sentence: ``expected to start ~14:20 (13:50-15:10) on gpu2:0 beside
    job 12 at ~0.8x; ends ~19:05`` (a running job: ``expected to end ~19:05``)."""
    if not waiting:
        return "expected to end " + ("~" + moment(end, now) if end is not None else
                                     "(not foreseen)")
    if start is None:
        return "no expected start: not foreseen within the forecast's horizon"
    out = f"expected to start ~{moment(max(start, now), now)}"
    if low is not None and high is not None and high - low >= 60:
        out += f" ({moment(max(low, now), now)}-{moment(high, now)})"
    if where:
        out += f" on {where}"
    if beside:
        out += " beside job" + ("s " if len(beside) > 1 else " ") + \
            ", ".join(str(i) for i in beside)
        if speed is not None:
            out += f" at ~{speed:.1f}x"
    if end is not None:
        out += f"; ends ~{moment(end, now)}"
    return out

"""Real job traces for ``iadeep sim --trace``: three formats, told apart by their header.

* the simulator's own CSV: ``submit_s,workload,duration_s[,gpus][,user]`` (``engine.load_trace``);
* the Philly extract (Jeon et al., ATC'19, as published with Pollux's simulator):
  ``timestamp,duration,num_gpus,gpu_time,cluster``, gzip or plain; no users or job names (the
  team, its ``cluster`` column, stands in as the user);
* a Slurm accounting export, ``sacct --allusers --parsable2`` (``|``-separated) with at least
  ``JobID,User,JobName,Submit,Start,End,State`` and the GPUs in ``AllocTRES`` or ``ReqTRES``
  (``gres/gpu=2`` or ``gres/gpu:a100=2``). Job steps (``123.batch``, ``123.0``) are not jobs and
  are passed over; a job that never started (Start ``Unknown``/``None``), is still running (End
  ``Unknown``), held no GPU, or ran 0 s is left out and counted. Failed, cancelled, timed-out
  and preempted jobs keep the run time they had (End - Start): they held their GPUs for it.

What is real: submission times, run times, GPU counts, users and job names (where the source
has them). What is drawn: each job's workload (``assign_workloads``, one of the profiled
workloads at random per seed), as Lucid's and Gavel's evaluations do; a trace of the
simulator's own CSV names its workloads and keeps them.

A window (``TraceWindow``): a start (a date, or days after the first submission) and a length
in days; a part: one team (Philly's cluster, Slurm's partition or account) and every k-th job.
Times shift so the window starts at 0. A bad row is one error naming the file and line.
"""
from __future__ import annotations

import csv
import gzip
import io
import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

from ..errors import InputError, NotFoundError
from ..profiles import Profile
from .engine import SimJob, load_trace, whole_gpus

SIM, PHILLY, SACCT = "sim", "philly", "sacct"
DAY_S = 86400.0
EPOCH = datetime(1970, 1, 1)
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus")
SACCT_COLUMNS = ("JobID", "User", "JobName", "Submit", "Start", "End", "State")
SIM_COLUMNS = ("submit_s", "workload", "duration_s")
HEADER_HINT = ("first line e.g.: submit_s,workload,duration_s,gpus (the simulator's CSV), "
               "timestamp,duration,num_gpus,gpu_time,cluster (Philly), or "
               "JobID|User|JobName|Partition|Submit|Start|End|State|AllocTRES "
               "(sacct --allusers --parsable2)")
ROW_HINT = "fix that row of the trace, or leave it out"


@dataclass(frozen=True)
class TraceWindow:
    """Which part of a trace to replay (every field optional)."""

    start: str | None = None   # "2017-10-03", "2017-10-03 08:00", or days after the first job
    days: float | None = None  # window length; None: to the end of the trace
    team: str | None = None    # Philly's cluster, Slurm's partition or account, else the user
    every: int = 1             # keep every k-th job (1st, k+1-th, ...) of the window

    def given(self) -> bool:
        return self != TraceWindow()

    def check(self) -> None:
        if self.days is not None and not (math.isfinite(self.days) and self.days > 0):
            raise InputError(f"--trace-days must be > 0, got {self.days:g}",
                             hint="e.g. --trace-days 7")
        if self.every < 1:
            raise InputError(f"--trace-every must be >= 1, got {self.every}",
                             hint="e.g. --trace-every 4 (every 4th job)")
        if self.team is not None and not self.team.strip():
            raise InputError("--trace-team is empty", hint="give a team, partition or account")


@dataclass(frozen=True)
class Row:
    """One job as the source gives it: times in the source's clock (seconds)."""

    line: int
    submit_s: float
    duration_s: float
    gpus: int
    user: str
    name: str = ""
    teams: tuple[str, ...] = ()    # what --trace-team matches
    workload: str = ""             # "" where the source has none


@dataclass(frozen=True)
class Trace:
    """A trace read and cut to its window: the jobs (submit times from the window's start)."""

    path: str
    format: str
    jobs: tuple                  # SimJob, ids 1..n in submission order
    has_workloads: bool
    start_s: float               # the window's start, in the source's clock
    days: float                  # the window's length (given, or to the last submission)
    start_text: str = ""         # the window's start as a date, for a dated source
    rows: int = 0                # jobs in the file (steps and left-out rows not counted)
    left_out: dict[str, int] = field(default_factory=dict)   # why -> how many

    def summary(self, cluster_gpus: int) -> dict:
        """What a run reports about its trace (``--json``): the real jobs, window and GPUs."""
        n = len(self.jobs)
        gpu_s = sum(j.gpus * j.duration_s for j in self.jobs)
        span_s = self.days * DAY_S
        out: dict[str, object] = {
            "path": self.path, "format": self.format, "jobs": n,
            "window_start": self.start_text or self.start_s, "window_days": self.days,
            "multi_gpu_jobs": sum(1 for j in self.jobs if j.gpus > 1),
            "max_job_gpus": max((j.gpus for j in self.jobs), default=0),
            "gpu_hours": gpu_s / 3600.0,
            "offered_load": gpu_s / (cluster_gpus * span_s) if span_s > 0 else math.nan,
            "users": len({j.user for j in self.jobs}),
            "workloads": "from the trace" if self.has_workloads else "drawn per seed"}
        if self.left_out:
            out["left_out"] = dict(self.left_out)
        return out


# --------------------------------------------------------------------------- reading
def _open_text(path: Path) -> io.TextIOBase:
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
        if magic == b"\x1f\x8b":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
        return open(path, encoding="utf-8", newline="")
    except FileNotFoundError:
        raise NotFoundError(f"{path}: trace file not found",
                            hint="pass a trace file: " + HEADER_HINT) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read trace ({exc.strerror or exc})",
                         hint="check the file's permissions") from None


def detect_format(header: Sequence[str]) -> str | None:
    cols = {c.strip() for c in header}
    if set(SIM_COLUMNS) <= cols:
        return SIM
    if set(PHILLY_COLUMNS) <= cols:
        return PHILLY
    if {"JobID", "Submit", "Start", "End"} <= cols:
        return SACCT
    return None


def sniff(path: str | Path) -> str:
    """The trace's format from its header (an error naming what a header should be)."""
    p = Path(path)
    with _open_text(p) as fh:
        try:
            first = fh.readline()
        except (OSError, UnicodeDecodeError, EOFError) as exc:
            raise InputError(f"{p}: cannot read trace ({exc})",
                             hint="check the file is UTF-8 text or gzip") from None
    sep = "|" if "|" in first else ","
    fmt = detect_format(first.rstrip("\r\n").split(sep))
    if fmt is None:
        raise InputError(f"{p}:1: not a trace header I know ({first.strip()[:80]!r})",
                         hint=HEADER_HINT)
    if fmt == SACCT:
        missing = [c for c in SACCT_COLUMNS if c not in first.rstrip("\r\n").split("|")]
        cols = first.rstrip("\r\n").split("|")
        if missing or not ({"AllocTRES", "ReqTRES"} & set(cols)):
            what = ", ".join(missing + ([] if {"AllocTRES", "ReqTRES"} & set(cols)
                                        else ["AllocTRES or ReqTRES"]))
            raise InputError(f"{p}:1: the sacct export lacks {what}",
                             hint="export with sacct --allusers --parsable2 --format="
                                  "JobID,User,JobName,Partition,Account,Submit,Start,End,"
                                  "State,AllocTRES,ReqTRES")
    return fmt


def _rows(p: Path, sep: str) -> Iterator[tuple[int, dict[str, str]]]:
    fh = _open_text(p)
    try:
        reader = csv.reader(fh, delimiter=sep) if sep == "," else (
            line.rstrip("\r\n").split("|") for line in fh)
        header = [c.strip() for c in next(iter(reader), [])]
        for lineno, raw in enumerate(reader, start=2):
            if not raw or (len(raw) == 1 and not raw[0].strip()):
                continue   # a blank line
            if len(raw) > len(header) and not any(x.strip() for x in raw[len(header):]):
                raw = raw[:len(header)]   # sacct --parsable: a trailing '|'
            if len(raw) != len(header):
                raise InputError(f"{p}:{lineno}: expected {len(header)} fields, got {len(raw)}",
                                 hint=ROW_HINT)
            yield lineno, dict(zip(header, raw))
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, csv.Error) as exc:
        raise InputError(f"{p}: cannot read trace ({exc})",
                         hint="check the file is UTF-8 text or gzip, complete") from None
    finally:
        fh.close()


def _bad(p: Path, line: int, col: str, what: str, raw: str) -> InputError:
    return InputError(f"{p}:{line}: {col}: {what}, got {raw.strip()[:60]!r}", hint=ROW_HINT)


def _number(p: Path, line: int, row: Mapping[str, str], col: str, minimum: float) -> float:
    raw = (row.get(col) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise _bad(p, line, col, "expected a number", raw) from None
    if not math.isfinite(value) or value < minimum:
        raise _bad(p, line, col, f"expected a number >= {minimum:g}", raw)
    return value


def _when(p: Path, line: int, col: str, raw: str) -> float:
    try:
        return (datetime.fromisoformat(raw.strip()) - EPOCH).total_seconds()
    except ValueError:
        raise _bad(p, line, col, "expected a date and time like 2017-10-03 08:00:00",
                   raw) from None


def _philly(p: Path) -> Iterator[Row | str]:
    for line, row in _rows(p, ","):
        submit = _when(p, line, "timestamp", row.get("timestamp") or "")
        dur = _number(p, line, row, "duration", 0.0)
        gpus = whole_gpus(p, line, "num_gpus", row.get("num_gpus") or "")
        team = (row.get("cluster") or "").strip() or "philly"
        if gpus == 0:
            yield "held no GPU"
        elif dur <= 0:
            yield "ran 0 s"
        else:
            yield Row(line, submit, dur, gpus, team, "", (team,))


TRES_GPU = re.compile(r"(?:^|,)gres/gpu(?::[^=,]*)?=([^,]*)")


def tres_gpus(p: Path, line: int, col: str, tres: str) -> int | None:
    """GPUs in a TRES list (``billing=4,cpu=8,gres/gpu=2,mem=64G``; typed ``gres/gpu:a100=2``,
    counted once when sacct also gives the untyped total); None when it names no GPU."""
    untyped = re.search(r"(?:^|,)gres/gpu=([^,]*)", tres)
    if untyped:
        return whole_gpus(p, line, col, untyped.group(1))
    typed = TRES_GPU.findall(tres)
    if not typed:
        return None
    return sum(whole_gpus(p, line, col, v) for v in typed)


def _sacct(p: Path) -> Iterator[Row | str]:
    for line, row in _rows(p, "|"):
        jobid = (row.get("JobID") or "").strip()
        if not jobid:
            raise _bad(p, line, "JobID", "expected a job id", jobid)
        if "." in jobid:
            continue   # a job step (123.batch, 123.extern, 123.0): its job's row counts
        start_raw, end_raw = (row.get("Start") or "").strip(), (row.get("End") or "").strip()
        state = (row.get("State") or "").strip()
        if start_raw in ("", "Unknown", "None"):
            yield "never started"
            continue
        if end_raw in ("", "Unknown", "None") or state.startswith(("RUNNING", "PENDING")):
            yield "still running"
            continue
        submit = _when(p, line, "Submit", row.get("Submit") or "")
        start = _when(p, line, "Start", start_raw)
        end = _when(p, line, "End", end_raw)
        if end < start:
            raise _bad(p, line, "End", "ends before its Start", end_raw)
        gpus = None
        for col in ("AllocTRES", "ReqTRES"):
            tres = (row.get(col) or "").strip()
            if tres:
                gpus = tres_gpus(p, line, col, tres)
                break
        if not gpus:
            yield "held no GPU"
            continue
        if end - start <= 0:
            yield "ran 0 s"
            continue
        user = (row.get("User") or "").strip() or "unknown"
        if any(c.isspace() or not c.isprintable() for c in user):
            raise _bad(p, line, "User", "expected a user name without spaces", user)
        teams = tuple(t for t in ((row.get("Partition") or "").strip(),
                                  (row.get("Account") or "").strip()) if t)
        yield Row(line, min(submit, start), end - start, gpus, user,
                  (row.get("JobName") or "").strip(), teams)


def _sim_rows(p: Path, profiles: Mapping[str, Profile]) -> Iterator[Row | str]:
    for line, row in _rows(p, ","):
        w = (row.get("workload") or "").strip()
        if w not in profiles:
            raise InputError(f"{p}:{line}: unknown workload {w!r}",
                             hint=f"known workloads: {', '.join(sorted(profiles))} "
                                  "(or add it to --profiles)")
        submit = _number(p, line, row, "submit_s", 0.0)
        dur = _number(p, line, row, "duration_s", 1e-9)
        raw = (row.get("gpus") or "").strip()
        gpus = whole_gpus(p, line, "gpus", raw) if raw else 1
        if gpus < 1:
            raise _bad(p, line, "gpus", "expected at least 1 GPU", raw)
        user = (row.get("user") or "").strip() or "sim"
        if any(c.isspace() or not c.isprintable() for c in user):
            raise _bad(p, line, "user", "expected a user name without spaces", user)
        yield Row(line, submit, dur, gpus, user, "", (user,), w)


def _start_of(p: Path, fmt: str, text: str, first: float) -> tuple[float, str]:
    """--trace-start: days after the first submission (a number), or a date on a dated trace."""
    try:
        days = float(text)
    except ValueError:
        days = None
    if days is not None:
        if not (math.isfinite(days) and days >= 0):
            raise InputError(f"--trace-start must be >= 0 days, got {text}",
                             hint="e.g. --trace-start 14 (days after the first job), or a "
                                  "date: --trace-start 2017-10-03")
        start = first + days * DAY_S
    elif fmt == SIM:
        raise InputError(f"--trace-start {text!r}: the simulator's CSV has no dates",
                         hint="give days after its first job, e.g. --trace-start 2")
    else:
        try:
            start = (datetime.fromisoformat(text.strip()) - EPOCH).total_seconds()
        except ValueError:
            raise InputError(f"--trace-start {text!r} is neither a date nor a number of days",
                             hint="e.g. --trace-start 2017-10-03, --trace-start "
                                  "'2017-10-03 08:00' or --trace-start 14") from None
    return start, "" if fmt == SIM else _iso(start)


def _iso(seconds: float) -> str:
    return (EPOCH + timedelta(seconds=seconds)).isoformat(sep=" ")


_CACHE: dict[tuple, Trace] = {}


def read_trace(path: str | Path, profiles: Mapping[str, Profile],
               window: TraceWindow = TraceWindow()) -> Trace:
    """Read ``path`` (any of the three formats) and cut it to ``window``."""
    window.check()
    p = Path(path)
    try:
        st = p.stat()
        key: tuple = (str(p), st.st_mtime_ns, st.st_size, window, tuple(sorted(profiles)))
    except OSError:
        key = ()
    if key and key in _CACHE:
        return _CACHE[key]
    fmt = sniff(p)
    if fmt == SIM and not window.given():   # the simulator's CSV as it always was
        jobs = load_trace(p, profiles)
        first = jobs[0].submit_s if jobs else 0.0
        last = jobs[-1].submit_s if jobs else 0.0
        out = Trace(str(p), SIM, tuple(jobs), True, first, (last - first) / DAY_S,
                    rows=len(jobs))
        if key:
            _CACHE[key] = out
        return out
    reader = {SIM: lambda: _sim_rows(p, profiles), PHILLY: lambda: _philly(p),
              SACCT: lambda: _sacct(p)}[fmt]
    rows: list[Row] = []
    left: dict[str, int] = {}
    for r in reader():
        if isinstance(r, str):
            left[r] = left.get(r, 0) + 1
        else:
            rows.append(r)
    n_rows = len(rows) + sum(left.values())
    if window.team is not None:
        team = window.team.strip()
        rows = [r for r in rows if team in r.teams]
        if not rows:
            raise InputError(f"{p}: no job of team {team!r}",
                             hint="teams here: " + _teams_hint(reader()))
    rows.sort(key=lambda r: (r.submit_s, r.line))
    first = rows[0].submit_s if rows else 0.0
    start, start_text = (_start_of(p, fmt, window.start, first) if window.start is not None
                         else (first, "" if fmt == SIM else _iso(first)))
    end = start + window.days * DAY_S if window.days is not None else math.inf
    rows = [r for r in rows if start <= r.submit_s < end]
    rows = rows[::window.every]
    if not rows:
        raise InputError(f"{p}: no job in the window (from {start_text or start}"
                         + (f", {window.days:g} days" if window.days is not None else "") + ")",
                         hint="move --trace-start or widen --trace-days")
    days = window.days if window.days is not None else max(
        (rows[-1].submit_s - start) / DAY_S, 1.0 / 24)
    out_jobs = tuple(SimJob(k + 1, round(r.submit_s - start, 3), r.workload, r.duration_s, r.gpus,
                        r.user, name=r.name) for k, r in enumerate(rows))
    out = Trace(str(p), fmt, out_jobs, fmt == SIM, start, days, start_text, n_rows, left)
    if key:
        _CACHE[key] = out
    return out


def _teams_hint(rows) -> str:
    seen: dict[str, int] = {}
    for r in rows:
        if not isinstance(r, str):
            for t in r.teams:
                seen[t] = seen.get(t, 0) + 1
    top = sorted(seen, key=lambda t: (-seen[t], t))[:8]
    return ", ".join(f"{t} ({seen[t]} jobs)" for t in top) or "none"


def assign_workloads(jobs: Sequence, workloads: Sequence[str], seed: int) -> list:
    """Give each job one of ``workloads`` at random (its own random per seed): the trace says
    when, how long and how many GPUs; the workload is drawn, as Lucid's and Gavel's
    evaluations do."""
    names = sorted(set(workloads))
    if not names:
        raise InputError("no workload has both a profile and truth measurements",
                         hint="check --profiles and --truth name the same workloads")
    rng = random.Random(f"trace-workloads:{seed}")
    return [replace(j, workload=rng.choice(names)) for j in jobs]

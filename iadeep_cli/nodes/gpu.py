"""What a node's GPUs look like: the GPU part of the one-round-trip poll script and the poll's
parser.

A remote poll is ONE ``exec_command`` running a small POSIX ``sh`` script that prints, between
marker lines, (1) ``nvidia-smi --query-gpu`` (2) ``--query-compute-apps`` (3) for every GPU pid
its session id and ``IADEEP_JOB_ID`` (so iadeep's own processes are told apart from foreign load)
(4) ``nvidia-smi pmon``: each process's SM and memory utilisation, asked only when there are
GPU processes (what the controller's own machine reads through NVML: the sharing jobs' speed
proxy and phase estimates need it) and (5) the per-job pid files in the node's job directory
(the job-state part, written by the shell backend: ``shell/jobstate.py``, whose
``poll_script`` joins both).  One round trip keeps a
cycle of many nodes cheap; parsing here is pure so it is tested against the real H200 output
byte for byte.

The query field lists are exactly the commands recorded in the fixtures' COMMANDS.tsv, so the
stand-in ``nvidia-smi`` used by the tests replays real output for the real command line.
"""
from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..snapshot import GpuProcess, GpuSample

GPU_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total", "memory.used",
    "memory.free", "utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw",
    "power.limit", "clocks.sm", "clocks.max.sm", "compute_mode", "mig.mode.current",
    "persistence_mode",
)
APP_FIELDS = ("pid", "gpu_uuid", "gpu_bus_id", "used_memory", "process_name")
GPU_QUERY = f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits"
APP_QUERY = f"nvidia-smi --query-compute-apps={','.join(APP_FIELDS)} --format=csv,noheader,nounits"
# Per-process utilisation: one sample (``-c 1``) of utilisation (``u``: sm, mem, enc, dec, and on
# current drivers jpg, ofa) and frame-buffer memory (``m``: fb, and ccpm) per process. pmon
# watches at most PMON_GPUS devices a run (its documented limit), so more are asked in groups
# with ``-i``. It answers after one collection interval (1 s by default, its help says), so it
# runs only when the node has GPU processes.
PMON_QUERY = "nvidia-smi pmon -c 1 -s um"
PMON_GPUS = 4
MARK = "@@iadeep"
NO_DEVICES = "No devices were found"


def remote_path(path: str) -> str:
    """Quote a path for a remote shell, keeping a leading ``~/`` expandable (as ``"$HOME"/``)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


# How long nvidia-smi may take before the poll gives up on it (coreutils ``timeout`` kills it,
# and its children, so a hung driver call never piles up processes on the node).
SMI_TIMEOUT_S = 10
# The most bytes of one job's progress file one poll reads (a job that writes more between two
# polls is read from its latest PROGRESS_MAX bytes: its rate is over the recent lines).
PROGRESS_MAX = 1 << 16

# What the controller expects on a node: (job id, session leader pid, its start time).
Expect = Sequence[tuple[int, "int | None", "int | None"]]


def gpu_script(timeout_s: float = SMI_TIMEOUT_S) -> str:
    """Shell for both nvidia-smi queries and the GPU processes' sessions and job ids.

    GPU pids are validated as digits before they touch /proc; nothing else is interpolated.
    stderr is kept out of the parsed output (a driver warning there must not make the node
    look broken) and fetched again only when the command failed, for the error message.
    A hung nvidia-smi is killed after ``timeout_s`` (exit 124) and the apps query is skipped.
    pmon runs only after a successful apps query that listed processes; whatever it prints (or
    fails to) costs only the per-process figures, never the node's GPU data.
    """
    to = f"timeout -k 2 {float(timeout_s):g}"
    return f"""\
t=""; command -v timeout >/dev/null 2>&1 && t="{to}"
g=$($t {GPU_QUERY} 2>/dev/null); r=$?
[ "$r" -eq 0 ] || [ "$r" -ge 124 ] || g=$($t {GPU_QUERY} 2>&1)
echo "{MARK} gpu $r"; printf '%s\\n' "$g"
a=""; [ "$r" -eq 0 ] && {{ a=$($t {APP_QUERY} 2>/dev/null); r=$?; }}
[ "$r" -eq 0 ] || [ "$r" -ge 124 ] || a=$($t {APP_QUERY} 2>&1)
echo "{MARK} apps $r"; printf '%s\\n' "$a"
echo "{MARK} procs"
if [ "$r" -eq 0 ]; then
  for p in $(printf '%s\\n' "$a" | cut -d, -f1); do
    case $p in ''|*[!0-9]*) continue;; esac
    [ -r /proc/$p/stat ] || continue
    s=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f4)
    j=$(tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^IADEEP_JOB_ID=//p' | head -n 1)
    echo "$p $s ${{j:--}} $(stat -c %U /proc/$p 2>/dev/null)"
  done
fi
echo "{MARK} pmon"
if [ "$r" -eq 0 ] && [ -n "$a" ]; then
  n=0; l=""
  for i in $(printf '%s\\n' "$g" | cut -d, -f1); do
    case $i in ''|*[!0-9]*) continue;; esac
    l="${{l:+$l,}}$i"; n=$((n + 1))
    [ "$n" -lt {PMON_GPUS} ] && continue
    $t {PMON_QUERY} -i "$l" 2>/dev/null; n=0; l=""
  done
  [ -z "$l" ] || $t {PMON_QUERY} -i "$l" 2>/dev/null
fi
"""


# What a node reports is bounded before anything trusts it: a broken driver, or a job that put
# its own nvidia-smi first on PATH, must not feed NaN, negative or absurd figures into placement,
# the database or --json, nor unbounded rows and strings into the controller's memory.
# Largest plausible value per field (all are >= 0); anything else is "not available".
LIMITS = {
    "index": 1023, "pid": 2 ** 22,                        # Linux's largest pid_max
    "memory.total": 2.0 ** 24, "memory.used": 2.0 ** 24,  # MiB: 16 TiB
    "memory.free": 2.0 ** 24, "used_memory": 2.0 ** 24,
    "utilization.gpu": 100.0, "utilization.memory": 100.0,
    "temperature.gpu": 200.0, "power.draw": 10_000.0, "power.limit": 10_000.0,
}
MAX_GPUS, MAX_APPS = 64, 4096     # rows per node: GPUs, compute processes
MAX_TEXT = 256                    # characters kept of a name, uuid or path
_CONTROL = dict.fromkeys((*range(0x20), *range(0x7F, 0xA0)), "?")


def bounded(value: Any, field: str) -> float | None:
    """``value`` as a float if it is a finite number in [0, LIMITS[field]], else None."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and 0 <= v <= LIMITS[field] else None


def clean(text: str) -> str:
    """A node's string, cut to MAX_TEXT characters, control characters (terminal escapes)
    replaced."""
    return text[:MAX_TEXT].translate(_CONTROL)


def _value(raw: str, field: str) -> float | None:
    """A numeric field, or None for ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, '',
    and for anything out of bounds (see LIMITS)."""
    raw = raw.strip()
    if not raw or raw.startswith("[") or raw.upper() == "N/A":
        return None
    return bounded(raw, field)


def _whole(raw: str, field: str) -> int | None:
    """A count or id: a whole number within bounds, else None."""
    v = _value(raw, field)
    return int(v) if v is not None and v.is_integer() else None


def _text(raw: str) -> str | None:
    raw = raw.strip()
    return None if not raw or raw.startswith("[") else clean(raw)


def _rows(text: str, fields: tuple[str, ...], limit: int) -> list[dict[str, str]]:
    """CSV rows (``a, b, c``) to dicts; the last field may itself contain commas (process names).
    More than ``limit`` rows is not a GPU node's output (ValueError, like a malformed row)."""
    rows: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if len(rows) == limit:
            raise ValueError(f"more than {limit} rows")
        parts = [p.strip() for p in line.split(",", len(fields) - 1)]
        if len(parts) != len(fields):
            raise ValueError(f"expected {len(fields)} comma-separated fields, "
                             f"got {clean(line)[:80]!r}")
        rows.append(dict(zip(fields, parts)))
    return rows


@dataclass(frozen=True)
class GpuRow:
    """One GPU as parsed (before processes are attached); ``driver`` goes on the node; ``mig``:
    MIG mode is on (per-process utilisation is not supported there: its figures are ignored)."""

    sample: GpuSample
    driver: str | None
    mig: bool = False


# GpuSample attribute -> nvidia-smi field, for the numeric ones
SAMPLE_FIELDS = {
    "memory_total_mib": "memory.total", "memory_used_mib": "memory.used",
    "memory_free_mib": "memory.free", "utilization_gpu": "utilization.gpu",
    "utilization_memory": "utilization.memory", "temperature_c": "temperature.gpu",
    "power_draw_w": "power.draw", "power_limit_w": "power.limit",
}


def parse_gpu_query(text: str) -> list[GpuRow]:
    out = []
    for row in _rows(text, GPU_FIELDS, MAX_GPUS):
        index = _whole(row["index"], "index")
        if index is None:
            raise ValueError(f"GPU row without a valid index: {clean(row['index'])[:20]!r}")
        values: dict[str, Any] = {a: _value(row[f], f) for a, f in SAMPLE_FIELDS.items()}
        sample = GpuSample(index=index, uuid=_text(row["uuid"]) or "",
                           name=_text(row["name"]) or "", **values)
        mig = (_text(row["mig.mode.current"]) or "").lower() == "enabled"
        out.append(GpuRow(sample, _text(row["driver_version"]), mig))
    return out


def parse_apps(text: str) -> list[tuple[str, GpuProcess]]:
    """``(gpu_uuid, process)`` pairs; rows whose pid is not a valid pid are skipped."""
    out = []
    for row in _rows(text, APP_FIELDS, MAX_APPS):
        pid = _whole(row["pid"], "pid")
        if not pid:
            continue
        out.append((_text(row["gpu_uuid"]) or "", GpuProcess(
            pid=pid, used_memory_mib=_value(row["used_memory"], "used_memory"),
            name=_text(row["process_name"]) or "")))
    return out


@dataclass(frozen=True)
class ProcessUtil:
    """One process's utilisation on one GPU as pmon sampled it (%): ``sm`` its share of the
    SMs' time, ``mem`` of the memory interface's; None where pmon printed ``-`` (no sample in
    its window, or not supported)."""

    sm: float | None
    mem: float | None


def _pmon_value(raw: str) -> float | None:
    return None if raw == "-" else _value(raw, "utilization.gpu")


def _add(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return b if a is None else a
    return min(100.0, a + b)


def parse_pmon(text: str) -> dict[tuple[int, int], ProcessUtil]:
    """``nvidia-smi pmon -c 1 -s um`` output (one or more runs) -> (GPU index, pid) -> figures.

    The columns are read from each run's header (``# gpu pid type sm mem ...``: current drivers
    add ``jpg ofa`` and, with ``m``, ``fb ccpm``; older ones print fewer), so a driver's extra
    column moves nothing; the unit line (``# Idx # C/G % ...``) and a GPU's row of ``-`` (no
    process) are skipped; the command (the last column) may hold spaces or be missing. A
    process listed twice on one GPU (a ``C`` and a ``G`` row) has its figures summed. Never
    raises: a row that does not fit its header is skipped (per-process figures are a bonus the
    node's GPU data never depends on), as is everything after MAX_APPS rows."""
    out: dict[tuple[int, int], ProcessUtil] = {}
    columns: list[str] = []
    for line in text.splitlines()[: 4 * MAX_APPS]:
        words = line.split()
        if not words:
            continue
        if words[0].startswith("#"):
            names = [w.lower() for w in (words[1:] if words[0] == "#" else
                                         [words[0][1:], *words[1:]])]
            if "pid" in names[:-1] and "gpu" in names[:-1]:   # the last is the command
                columns = names
            continue
        if not columns or len(words) < len(columns) - 1 or len(out) >= MAX_APPS:
            continue
        row = dict(zip(columns[:-1], words))
        index, pid = _whole(row["gpu"], "index"), _whole(row["pid"], "pid")
        if index is None or not pid:
            continue
        util = ProcessUtil(_pmon_value(row.get("sm", "-")), _pmon_value(row.get("mem", "-")))
        if (index, pid) in out:
            before = out[(index, pid)]
            util = ProcessUtil(_add(before.sm, util.sm), _add(before.mem, util.mem))
        out[(index, pid)] = util
    return out


def split_sections(output: str) -> dict[str, tuple[str | None, str]]:
    """Split the poll script's output on its marker lines: name -> (argument, body)."""
    sections: dict[str, tuple[str | None, list[str]]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith(MARK + " "):
            parts = line.split()
            current = parts[1]
            sections[current] = (parts[2] if len(parts) > 2 else None, [])
        elif current is not None:
            sections[current][1].append(line)
    return {k: (arg, "\n".join(lines)) for k, (arg, lines) in sections.items()}


def nvidia_smi_error(rc: int, body: str) -> str | None:
    """A one-line reason when nvidia-smi failed, else None (``No devices`` is not a failure)."""
    if rc == 0 or NO_DEVICES in body:
        return None
    first = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")
    if rc in (124, 137):   # killed by the poll's `timeout`
        return "nvidia-smi did not answer in time (driver hung?); the node's jobs are still " \
               "tracked over SSH"
    if rc == 127 or "not found" in first:
        return "nvidia-smi not found on the node (exit 127); install the NVIDIA driver or " \
               "remove the node from the inventory"
    return f"nvidia-smi failed (exit {rc}): {first or 'no output'}"


def job_map(procs_text: str, known: set[int], sessions: dict[int, int],
            owner_of: Mapping[int, str] | None = None,
            tags: Mapping[int, tuple[int, str]] | None = None) -> dict[int, int]:
    """pid -> job id for GPU processes that iadeep started.

    ``known``: job ids with a claimed directory on this node (a launch in progress too: its
    process may run before its pid file is written); ``sessions``: session id -> job id of the
    jobs whose session leader is alive now.  A process belongs to job J if its environment says
    ``IADEEP_JOB_ID=J`` and J is known here (finished jobs too: a job's last process may outlive
    its exit file by a moment, and is still not foreign), or (environment unreadable: another
    user's process) if its session is a live job's (jobs are started with setsid, so
    pid == sid; a finished job's pid may already belong to someone else).

    On a submitter node (``owner_of``: job id -> its owner) a tag counts only on a process
    of the job's owner, and ``tags`` (pid -> (job id, user): what each user's own section
    of the poll found in their processes' environments) fills in what the SSH account cannot
    read; a user can tag only their own processes.
    """
    out: dict[int, int] = {}
    for line in procs_text.splitlines():
        parts = line.split()
        if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
            continue
        pid, sid = int(parts[0]), int(parts[1])
        env_job = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
        if owner_of is not None:
            owner = parts[3] if len(parts) > 3 else None
            tagged = (tags or {}).get(pid)
            if env_job is not None and owner is not None and owner_of.get(env_job) == owner:
                out[pid] = env_job
            elif tagged is not None and owner is not None and tagged[1] == owner:
                out[pid] = tagged[0]
            elif sid in sessions:
                out[pid] = sessions[sid]
            continue
        if env_job is not None and env_job in known:
            out[pid] = env_job
        elif sid in sessions:
            out[pid] = sessions[sid]
    return out

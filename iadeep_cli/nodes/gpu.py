"""What a node's GPUs look like: the one-round-trip poll script and its parser.

A remote poll is ONE ``exec_command`` running a small POSIX ``sh`` script that prints, between
marker lines, (1) ``nvidia-smi --query-gpu`` (2) ``--query-compute-apps`` (3) for every GPU pid
its session id and ``IADEEP_JOB_ID`` (so iadeep's own processes are told apart from foreign load)
and (4) the per-job pid files in the node's job directory.  One round trip keeps a cycle of many
nodes cheap; parsing here is pure so it is tested against the real H200 output byte for byte.

The query field lists are exactly the commands recorded in the fixtures' COMMANDS.tsv, so the
stand-in ``nvidia-smi`` used by the tests replays real output for the real command line.
"""
from __future__ import annotations

import math
import shlex
import time
from dataclasses import dataclass

from ..snapshot import GpuProcess, GpuSample, NodeSnapshot

GPU_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total", "memory.used",
    "memory.free", "utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw",
    "power.limit", "clocks.sm", "clocks.max.sm", "compute_mode", "mig.mode.current",
    "persistence_mode",
)
APP_FIELDS = ("pid", "gpu_uuid", "gpu_bus_id", "used_memory", "process_name")
GPU_QUERY = f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits"
APP_QUERY = f"nvidia-smi --query-compute-apps={','.join(APP_FIELDS)} --format=csv,noheader,nounits"
MARK = "@@iadeep"
NO_DEVICES = "No devices were found"


def remote_path(path: str) -> str:
    """Quote a path for a remote shell, keeping a leading ``~/`` expandable (as ``"$HOME"/``)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def poll_script(workdir: str) -> str:
    """The shell script for one poll; ``workdir`` is Node.workdir (quoted, ``~`` kept working).

    GPU pids are validated as digits before they touch /proc; nothing else is interpolated.
    stderr is kept out of the parsed output (a driver warning there must not make the node
    look broken) and fetched again only when the command failed, for the error message.
    """
    jobs = remote_path(workdir.rstrip("/") + "/jobs")
    return f"""\
g=$({GPU_QUERY} 2>/dev/null); r=$?
[ "$r" -eq 0 ] || g=$({GPU_QUERY} 2>&1)
echo "{MARK} gpu $r"; printf '%s\\n' "$g"
a=$({APP_QUERY} 2>/dev/null); r=$?
[ "$r" -eq 0 ] || a=$({APP_QUERY} 2>&1)
echo "{MARK} apps $r"; printf '%s\\n' "$a"
echo "{MARK} procs"
if [ "$r" -eq 0 ]; then
  for p in $(printf '%s\\n' "$a" | cut -d, -f1); do
    case $p in ''|*[!0-9]*) continue;; esac
    [ -r /proc/$p/stat ] || continue
    s=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f4)
    j=$(tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^IADEEP_JOB_ID=//p')
    echo "$p $s $j"
  done
fi
echo "{MARK} jobs"
for f in {jobs}/*/launched; do
  [ -f "$f" ] || continue
  d=${{f%/launched}}
  if [ -f "$d/pid" ]; then
    x=""; [ -f "$d/exit" ] && x=" exited"
    read p st < "$d/pid"; echo "${{d##*/}} $p$x"
  else echo "${{d##*/}} - claimed"; fi
done
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
_CONTROL = {c: "?" for c in (*range(0x20), *range(0x7F, 0xA0))}


def bounded(value, field: str) -> float | None:
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
    rows = []
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
    """One GPU as parsed (before processes are attached); ``driver`` goes on the node."""

    sample: GpuSample
    driver: str | None


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
        sample = GpuSample(
            index=index, uuid=_text(row["uuid"]) or "", name=_text(row["name"]) or "",
            **{attr: _value(row[field], field) for attr, field in SAMPLE_FIELDS.items()})
        out.append(GpuRow(sample, _text(row["driver_version"])))
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


def _sections(output: str) -> dict[str, tuple[str | None, str]]:
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
    if rc == 127 or "not found" in first:
        return "nvidia-smi not found on the node (exit 127); install the NVIDIA driver or " \
               "remove the node from the inventory"
    return f"nvidia-smi failed (exit {rc}): {first or 'no output'}"


def job_map(procs_text: str, jobs_text: str) -> dict[int, int]:
    """pid -> job id for GPU processes that iadeep started.

    ``jobs_text``: one line per claimed job directory, ``ID PID`` (live), ``ID PID exited`` or
    ``ID - claimed`` (launch in progress: its process may already run before its pid file is
    written).  A process belongs to job J if its environment says ``IADEEP_JOB_ID=J`` and J has
    a job directory on this node (finished ones too: a job's last process may outlive its exit
    file by a moment, and is still not foreign), or (environment unreadable: another user's process)
    if its session id is the session of a *live* job (jobs are started with setsid, so
    pid == sid; a finished job's pid may already belong to someone else).
    """
    sessions: dict[int, int] = {}
    known: set[int] = set()
    for line in jobs_text.splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        known.add(int(parts[0]))
        if parts[1].isdigit() and parts[2:3] != ["exited"]:
            sessions[int(parts[1])] = int(parts[0])
    out: dict[int, int] = {}
    for line in procs_text.splitlines():
        parts = line.split()
        if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
            continue
        pid, sid = int(parts[0]), int(parts[1])
        env_job = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
        if env_job is not None and env_job in known:
            out[pid] = env_job
        elif sid in sessions:
            out[pid] = sessions[sid]
    return out


def attach(rows: list[GpuRow], apps: list[tuple[str, GpuProcess]], jobs: dict[int, int],
           only: tuple[int, ...] | None) -> tuple[GpuSample, ...]:
    """Put each process on its GPU (by uuid), tag iadeep's, keep only the inventory's GPUs."""
    by_uuid: dict[str, list[GpuProcess]] = {}
    for uuid, proc in apps:
        job_id = jobs.get(proc.pid)
        if job_id is not None:
            proc = GpuProcess(proc.pid, proc.used_memory_mib, proc.name, job_id)
        by_uuid.setdefault(uuid, []).append(proc)
    out = []
    for row in rows:
        if only is not None and row.sample.index not in only:
            continue
        procs = tuple(sorted(by_uuid.get(row.sample.uuid, ()), key=lambda p: p.pid))
        out.append(GpuSample(**{**row.sample.__dict__, "processes": procs}))
    return tuple(out)


def parse_poll(name: str, output: str, *, only: tuple[int, ...] | None = None,
               taken_at: float | None = None, rtt_s: float | None = None) -> NodeSnapshot:
    """The poll script's output -> NodeSnapshot (with ``error`` set when nvidia-smi failed)."""
    taken_at = time.time() if taken_at is None else taken_at
    sec = _sections(output)

    def snap(gpus=(), error=None, driver=None):
        return NodeSnapshot(name=name, taken_at=taken_at, gpus=gpus, error=error,
                            driver_version=driver, rtt_s=rtt_s)

    if "gpu" not in sec:
        return snap(error="unexpected poll output (no GPU section): "
                          + (output.strip().splitlines() or ["empty"])[0][:200])
    rc_text, body = sec["gpu"]
    rc = int(rc_text) if rc_text and rc_text.lstrip("-").isdigit() else -1
    err = nvidia_smi_error(rc, body)
    if err:
        return snap(error=err)
    if NO_DEVICES in body:
        return snap()
    try:
        rows = parse_gpu_query(body)
        apps_rc, apps_body = sec.get("apps", ("1", ""))
        apps = parse_apps(apps_body) if apps_rc == "0" and NO_DEVICES not in apps_body else []
    except ValueError as exc:
        return snap(error=f"cannot parse nvidia-smi output: {exc}")
    jobs = job_map(sec.get("procs", (None, ""))[1], sec.get("jobs", (None, ""))[1])
    driver = next((r.driver for r in rows if r.driver), None)
    return snap(gpus=attach(rows, apps, jobs, only), driver=driver)

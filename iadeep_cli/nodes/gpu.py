"""What a node's GPUs look like: the GPU part of the one-round-trip poll script and the poll's
parser.

A remote poll is ONE ``exec_command`` running a small POSIX ``sh`` script that prints, between
marker lines, (1) ``nvidia-smi --query-gpu`` (2) ``--query-compute-apps`` (3) for every GPU pid
its session id and ``IADEEP_JOB_ID`` (so iadeep's own processes are told apart from foreign load)
and (4) the per-job pid files in the node's job directory (the job-state part, written by the
shell backend: ``shell/jobstate.py``, whose ``poll_script`` joins both).  One round trip keeps a
cycle of many nodes cheap; parsing here is pure so it is tested against the real H200 output
byte for byte.

The query field lists are exactly the commands recorded in the fixtures' COMMANDS.tsv, so the
stand-in ``nvidia-smi`` used by the tests replays real output for the real command line.
"""
from __future__ import annotations

import math
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..snapshot import GpuProcess, GpuSample, NodeSnapshot, RemoteJob, RemoteState

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
        values: dict[str, Any] = {a: _value(row[f], f) for a, f in SAMPLE_FIELDS.items()}
        sample = GpuSample(index=index, uuid=_text(row["uuid"]) or "",
                           name=_text(row["name"]) or "", **values)
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


def _int(text: str) -> int | None:
    return int(text) if text.lstrip("-").isdigit() and len(text) < 20 else None


# An exit code as a job's exit file may say it: the wrapper writes the shell's status (0-255),
# but the file is the job's to overwrite; a number outside a 32-bit int is no exit code (as no
# file: the job was killed), never a value the database cannot hold.
EXIT_MIN, EXIT_MAX = -(2**31), 2**31 - 1


def _exit_code(text: str) -> int | None:
    code = _int(text)
    return code if code is not None and EXIT_MIN <= code <= EXIT_MAX else None


def parse_states(text: str) -> tuple[tuple[int, RemoteJob], ...]:
    """The state section (see ``state_script``) -> ((job id, RemoteJob), ...)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or _int(parts[0]) is None or parts[1] not in (
                "running", "exited", "missing", "claimed"):   # never "unknown": see user_states
            continue
        pid = _int(parts[2]) if len(parts) > 2 else None
        if parts[1] == "running":
            job = RemoteJob(RemoteState.RUNNING, None, pid,
                            _int(parts[3]) if len(parts) > 3 else None)
        elif parts[1] == "exited":
            job = RemoteJob(RemoteState.EXITED,
                            _exit_code(parts[3]) if len(parts) > 3 else None, pid)
        else:
            job = RemoteJob(RemoteState(parts[1]))
        out.append((int(parts[0]), job))
    return tuple(out)


# dd's last line on stderr (C locale), with the bytes it copied: "25 bytes copied, ..." (and
# "1 byte", and before coreutils 8.24 "25 bytes (25 B) copied, ...")
_DD_COPIED = re.compile(r"(\d+) bytes? (?:\([^)]*\) )?copied")
# One job's new progress bytes as a poll read them: (job id, the offset they start at, the
# file's size then, the bytes as text: progress_script keeps them ASCII).
Progress = tuple[int, int, int, str]


def parse_progress(sec: dict[str, tuple[str | None, str]]) -> tuple[Progress, ...]:
    """The files a poll read progress from (see ``progress_script``): each ``progress:ID``
    section, in the order they were read, says how many of the ``progress-bytes`` are that
    file's (dd's own count); a file's bytes are believed only if it was the same regular file
    after the read as before it.  Nothing is believed if the counts do not add up to the bytes
    there are (the reads were cut short), since then no file's bytes are known to be its."""
    if "progress-bytes" not in sec:
        return ()
    blob = sec["progress-bytes"][1]
    after = {}
    for line in sec.get("progress-check", (None, ""))[1].splitlines():
        path, _, rest = line.partition(" ")
        after[path] = rest
    out, pos = [], 0
    for key, (arg, body) in sec.items():
        if not key.startswith("progress:"):
            continue
        before, *told = body.splitlines() or [""]
        counts = [int(m.group(1)) for line in told if (m := _DD_COPIED.match(line))]
        if not counts:   # dd could not open the file (it copies nothing then): skip it only
            continue     # (had it copied bytes, the total check below catches it)
        text, pos = blob[pos:pos + counts[-1]], pos + counts[-1]   # its last count: the total
        job, fields = _int(key[len("progress:"):]), (arg or "").split(",")
        if job is None or len(fields) != 2:
            continue
        start, size = _int(fields[0]), _int(fields[1])
        name, _, stat = before.partition(" ")
        if start is None or size is None or name != f"{job}/progress" \
                or after.get(name) != stat:
            continue
        out.append((job, start, size, text[:PROGRESS_MAX]))
    return tuple(out) if pos == len(blob) else ()


def job_sections(sec: dict[str, tuple[str | None, str]]
                 ) -> tuple[tuple[tuple[int, RemoteJob], ...] | None, set[int], dict[int, int]]:
    """(states, known job dirs, live sessions) from a poll's sections; states is None when the
    state section is missing (the script did not run)."""
    if "state" not in sec:
        return None, set(), {}
    states = parse_states(sec["state"][1])
    known = {int(x) for x in sec.get("dirs", (None, ""))[1].split() if x.isdigit()}
    sessions = {job.pid: j for j, job in states if job.state == "running" and job.pid}
    return states, known | {j for j, _ in states}, sessions


@dataclass(frozen=True)
class UserStates:
    """What the per-user sections of a submitter node's poll say (see ``runas.poll_sections``)."""

    states: tuple[tuple[int, RemoteJob], ...]
    owner_of: dict[int, str]              # job id -> owner, for tagging GPU processes
    sessions: dict[int, int]              # live session leader -> job id
    tags: dict[int, tuple[int, str]]      # pid -> (job id, its user)
    errors: dict[str, str]                # user -> why their section could not run
    progress: tuple[Progress, ...] = ()   # their running jobs' new progress (read as them)


def user_states(sec: dict[str, tuple[str | None, str]], owners: Mapping[int, str]) -> UserStates:
    """Each user's section is believed only about that user's jobs (``owners``: the expected
    jobs' owners).  A job whose owner's section did not run (sudo refused, the user missing,
    a timeout) is ``unknown``, never ``missing``: the node answered, but nobody looked, and a
    job must not be taken for never started (and started again) because its owner's sudo
    broke."""
    states: list[tuple[int, RemoteJob]] = []
    owner_of = dict(owners)
    sessions: dict[int, int] = {}
    tags: dict[int, tuple[int, str]] = {}
    errors: dict[str, str] = {}
    progress: list[Progress] = []
    for key, (_, body) in sec.items():
        if not key.startswith("as:"):
            continue
        user = key[3:]
        lines = [ln[2:] for ln in body.splitlines() if ln.startswith("| ")]
        rc = sec.get(f"as-rc:{user}", ("-", ""))[0]
        inner = split_sections("\n".join(lines))
        got, known, live = job_sections(inner)
        if rc != "0" or got is None:
            errors[user] = clean(next((ln for ln in reversed(lines) if ln.strip()),
                                      f"exit {rc}"))
            continue
        mine = {j for j, u in owners.items() if u == user}
        states.extend((j, job) for j, job in got if j in mine)
        progress.extend(x for x in parse_progress(inner) if x[0] in mine)
        sessions.update((pid, j) for pid, j in live.items() if j in mine)
        for j in known:
            owner_of.setdefault(j, user)
        for line in inner.get("tags", (None, ""))[1].splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() \
                    and owner_of.get(int(parts[1])) == user:
                tags[int(parts[0])] = (int(parts[1]), user)
    answered = {j for j, _ in states}
    states.extend((j, RemoteJob(RemoteState.UNKNOWN)) for j in owners if j not in answered)
    return UserStates(tuple(states), owner_of, sessions, tags, errors, tuple(progress))


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
               taken_at: float | None = None, rtt_s: float | None = None,
               owners: Mapping[int, str] | None = None,
               expected: Sequence[int] = ()) -> NodeSnapshot:
    """The poll script's output -> NodeSnapshot: the jobs' states whenever the script ran, and
    ``error`` set when nvidia-smi failed (the node still answered: its jobs are still known).
    ``owners`` (job id -> owner): the node runs jobs as their submitters, and their states
    are in per-user sections (``user_states``).  An ``expected`` job the state section does
    not mention (its part of the poll was cut short) is ``unknown``: nobody looked."""
    taken_at = time.time() if taken_at is None else taken_at
    sec = split_sections(output)
    states, known, sessions = job_sections(sec)
    progress = parse_progress(sec)
    by_user = None
    if owners is not None and states is not None:
        by_user = user_states(sec, owners)
        states = states + by_user.states
        known |= set(by_user.owner_of)
        sessions.update(by_user.sessions)
        progress += by_user.progress
    if states is not None:
        told = {j for j, _ in states}
        states += tuple((int(j), RemoteJob(RemoteState.UNKNOWN)) for j in dict.fromkeys(expected)
                        if int(j) not in told)

    def snap(gpus=(), error=None, driver=None):
        return NodeSnapshot(name=name, taken_at=taken_at, gpus=gpus, error=error,
                            driver_version=driver, rtt_s=rtt_s, jobs=states,
                            progress=progress)

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
    jobs = job_map(sec.get("procs", (None, ""))[1], known, sessions,
                   None if by_user is None else by_user.owner_of,
                   None if by_user is None else by_user.tags)
    driver = next((r.driver for r in rows if r.driver), None)
    return snap(gpus=attach(rows, apps, jobs, only), driver=driver)

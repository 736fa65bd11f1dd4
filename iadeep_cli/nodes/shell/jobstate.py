"""The job part of the shell backend's poll: a POSIX ``sh`` script that prints, between the
poll's marker lines, the expected jobs' states from their job directories (pid and exit files,
checked against /proc), the claimed job directories, and the new bytes of the running jobs'
progress files. ``poll_script`` sends it with the GPU part (``gpu.gpu_script``) as one command:
one round trip per node per round. Its output is parsed here too (``parse_poll``, with the
nvidia-smi part parsed by ``nodes/gpu.py``; ``parse_states``, ``parse_progress``, and a
submitter node's per-user sections, ``user_states``).
"""
from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from ...snapshot import (
    MEM_LIMIT,
    REQUEUE_ASKED,
    GpuProcess,
    GpuSample,
    NodeSnapshot,
    RemoteJob,
    RemoteState,
)
from ..gpu import (
    MARK,
    NO_DEVICES,
    PROGRESS_MAX,
    SMI_TIMEOUT_S,
    Expect,
    GpuRow,
    ProcessUtil,
    clean,
    gpu_script,
    job_map,
    nvidia_smi_error,
    parse_apps,
    parse_gpu_query,
    parse_pmon,
    remote_path,
    split_sections,
)

# How long the job part of a poll (states, progress) may take on a node before ``timeout``
# kills it with every process it started; it reads only small files without blocking, so
# this is a backstop, never a wait.
STATE_TIMEOUT_S = 10
# The most bytes of a job's control file (pid, exit) the poll reads: the job can write them.
CONTROL_MAX = 64
# The most bytes of all the node's jobs' progress files together one poll reads (each one's:
# gpu.PROGRESS_MAX), so that a poll's answer stays well under the SSH limit.
PROGRESS_TOTAL = 1 << 22
# What a progress line may hold ("<time> <iterations>"); every other byte is shown as '?', so
# what a job writes there keeps its length (offsets stay exact) and can never pass for one of
# the poll's marker lines.
_PROGRESS_CHARS = "0-9.eE+ \\n-"

# Defines ``me`` (this account's uid) and ``rd FILE``: the first line of up to CONTROL_MAX bytes
# of FILE, printed only if FILE is a regular file of this account's, opened without blocking
# (a FIFO there returns at once) and never through a symbolic link (dd's O_NONBLOCK and
# O_NOFOLLOW), and if the same file (device and inode) is still there after the read.  A job
# can shape its own directory as it likes; its files are never opened any other way.
READ_CONTROL = (
    "me=$(id -u)\n"
    'rd() { set -- "$1" $(stat -c "%f %u %d:%i" -- "$1" 2>/dev/null)\n'
    '  [ $# = 4 ] && [ "$3" = "$me" ] && [ $((0x$2 & 61440)) = 32768 ] || return 0\n'
    f'  v=$(dd if="$1" iflag=nonblock,nofollow bs={CONTROL_MAX} count=1 status=none '
    "2>/dev/null | head -n 1)\n"
    '  [ "$(stat -c "%f %u %d:%i" -- "$1" 2>/dev/null)" = "$2 $3 $4" ] && '
    "printf '%s\\n' \"$v\"; }\n")
# Sets $p, $st (the pid file's "PID STARTTIME", bounded and checked) from "$d/pid".  (% keeps
# the shell's ${...} as written; an f-string would double every brace.)
_READ_PIDFILE = (
    'set -- $(rd "$d/pid"); p=${1:-}; st=${2:--}\n'
    "case $p in ''|*[!0-9]*) p=-;; esac\n"
    "case $st in ''|*[!0-9]*) st=-;; esac\n")


def _indent(text: str, n: int) -> str:
    return "".join(" " * n + line + "\n" for line in text.splitlines())


def _verdict(state: str, sid: str, start: str) -> str:
    """Shell that sets $ours=1 and $now when process $p, whose stat fields ``state``, ``sid``
    and ``start`` name, is alive (not a zombie), leads its own session and started at $st
    (unless $st is '-').  After a reboot a pid may belong to someone else, even another job's
    session leader: a process is ours only if all of this holds."""
    return (f'case "{state}" in Z*|X*|"") ;; *) [ "{sid}" = "$p" ] && '
            f'{{ [ "$st" = - ] || [ "{start}" = "$st" ]; }} && {{ ours=1; now={start}; }};; esac\n')


# Sets $ours and $now (``_verdict``) from /proc/$p/stat, read by the shell itself (no process
# per job); the command name, which may hold anything, ends at its last ") ".
IS_OURS = (
    'ours=0; now=-; s=""\n'
    '[ "$p" != - ] && [ -r /proc/$p/stat ] && { read -r s < /proc/$p/stat; } 2>/dev/null\n'
    's=${s##*) }; set -- $s\n'
    + _verdict("${1:-}", "${4:-}", "${20:-}")
)


# The expected jobs' session leaders, all read by one ``sed`` before the loop (a shell's
# ``read`` takes /proc/PID/stat one byte per system call: ~300 a job, most of a poll's cost on a
# node with many jobs).  Each readable file gives one line "PID STATE SID START" (its name ends
# at the last ") ", so nothing the job calls itself moves the fields; a name with a newline
# keeps one line too: the whole file is joined first); a pid that is gone prints nothing.
# The line's four values are checked before ``L_PID`` is set from them (the job writes none
# of them, but a poll believes nothing unchecked); IS_OURS_FAST uses it.  Where sed fails (not
# GNU sed: no ``-s``), no ``L_PID`` is set and every job is read as before, one by one.
_STAT_LINE = (r"1h;1!H;${x;s/^\([0-9][0-9]*\) .*) \([^ ][^ ]*\) [^ ][^ ]* [^ ][^ ]* "
              r"\([0-9][0-9]*\) \([^ ][^ ]* \)\{15\}\([0-9][0-9]*\)\( .*\)\{0,1\}$/\1 \2 \3 \5/p}")


def leaders_script(pids: Iterable[int]) -> str:
    """Shell that sets ``L_PID="STATE SID START"`` for each of ``pids`` (ints) that is alive."""
    files = " ".join(f"/proc/{int(p)}/stat" for p in sorted(set(pids)))
    if not files:
        return ""
    return (f"set -- $(LC_ALL=C sed -n -s {shlex.quote(_STAT_LINE)} {files} 2>/dev/null)\n"
            'while [ $# -ge 4 ]; do case $1:$3:$4 in *[!0-9:]*|:*|*::*|*:) ;; *)\n'
            '  case $2 in [A-Za-z]) eval "L_$1=\\"\\$2 \\$3 \\$4\\"";; esac;; esac; shift 4\n'
            "done\n")


# IS_OURS from what ``leaders_script`` read, where that says $p is ours (the usual case: the
# recorded leader, alive); in every other case (a pid from the pid file, a leader gone, or a
# sed that read something else) IS_OURS itself decides, as it did before the one read.
IS_OURS_FAST = (
    'ours=0; L=""; [ "$p" = - ] || eval "L=\\${L_$p:-}"\n'
    'if [ -n "$L" ]; then s=$L; set -- $L\n'
    + _indent(_verdict("$1", "$2", "$3"), 2) +
    "fi\n"
    'if [ "$ours" != 1 ]; then\n' + _indent(IS_OURS, 2) + "fi\n")


def state_script(workdir: str, expect: Expect, progress: Mapping[int, int] | None = None,
                 timeout_s: float = STATE_TIMEOUT_S, budget: int = PROGRESS_TOTAL) -> str:
    """Shell that prints one ``ID STATE [PID [CODE|START]]`` line per expected job, and the new
    bytes of the running ones' progress files (``progress``: job id -> the offset to read from,
    at most ``budget`` bytes in all; see ``progress_script``).

    ``expect``: (job id, session leader pid, its start time) as the controller recorded them at
    launch, or None where it has not (a launch still in flight, a crash before it was recorded:
    then the pid file says).  The recorded pid wins over the pid file because the job can
    rewrite or delete its own files: a job is running while its recorded session leader lives,
    whatever its directory says, and its exit file is believed only once the leader is gone.
    Every value interpolated here is an int (checked) or '-'.

    The whole of it runs under coreutils ``timeout`` (where the node has it), which kills it
    and every process it started (its own process group) after ``timeout_s``: nothing a job
    does to its files can keep a reader waiting on the node.  A job whose line is missing
    because of that is "unknown" to the parser (see ``parse_poll``), never "missing".
    """
    jobs = remote_path(workdir.rstrip("/") + "/jobs")
    items = " ".join(f"{int(j)}:{'-' if p is None else int(p)}:{'-' if t is None else int(t)}"
                     for j, p, t in expect)
    want = {int(j): max(0, int(o)) for j, o in (progress or {}).items()}
    offsets = "".join(f"o_{j}={o}; " for j, o in want.items())
    body = (
        f'echo "{MARK} state"\n'
        "set -f\n"   # no globbing of what the job wrote into its files
        + READ_CONTROL + f"J={jobs}; P=''; {offsets}\n"
        + leaders_script(p for _, p, _ in expect if p is not None) +
        f"for x in {items}; do\n"
        '  j=${x%%:*}; r=${x#*:}; p=${r%%:*}; st=${r#*:}; d=$J/$j\n'
        '  if [ "$p" = - ]; then\n'
        '    if [ -f "$d/pid" ]; then\n' + _indent(_READ_PIDFILE, 6) +
        '    elif [ -f "$d/launched" ]; then echo "$j claimed"; continue\n'
        '    else echo "$j missing"; continue; fi\n'
        '  fi\n'
        + _indent(IS_OURS_FAST, 2) +
        '  if [ "$ours" = 1 ]; then echo "$j running $p $now"\n'
        '    eval "[ -z \\"\\${o_$j:-}\\" ]" || P="$P $j/progress"; continue; fi\n'
        '  c=$(rd "$d/exit")\n'
        "  case $c in ''|-|*[!0-9-]*) c=-;; esac\n"
        # No exit code and no leader: the job may have killed its wrapper (kill -9 $PPID).
        # Its processes keep the session; while one of this account's lives the job runs.
        # (Linux never gives pid $p to a new process while a session is still named by it,
        # so a live non-leader $p means the job's session is gone: nothing to look for.)
        '  if [ "$c" = - ] && [ "$p" != - ]; then case "$s" in ""|Z*|X*)\n'
        '    set +f; k=0; for f in /proc/[0-9]*/stat; do [ -O "$f" ] || continue\n'
        '      { read -r s < "$f"; } 2>/dev/null || continue; s=${s##*) }; set -- $s\n'
        '      case "${1:-}" in Z*|X*|"") continue;; esac; [ "${4:-}" = "$p" ] && k=1 && break\n'
        '    done; set -f; [ $k = 1 ] && { echo "$j running $p $st"; continue; };; esac; fi\n'
        # the job asked to be requeued (its `scontrol requeue`: nodes/shell/slurm_in_job.py)
        '  q=; [ -f "$d/memlimit" ] && q=" mem-limit"; [ -f "$d/requeue" ] && q=" requeue"\n'
        '  echo "$j exited $p $c$q"\n'
        "done\n"
        # every claimed job directory: their processes are iadeep's (see job_map)
        f'echo "{MARK} dirs"\n'
        "set +f\n"
        'for f in $J/*/launched; do [ -f "$f" ] && { d=${f%/launched}; '
        'echo "${d##*/}"; }; done\n'
        + progress_script(progress_cap(len(want), budget))
    )
    to = f"timeout -k 1 {float(timeout_s):g}"
    return (f't=""; command -v timeout >/dev/null 2>&1 && t="{to}"\n'
            f"$t sh -c {shlex.quote(body)}\n")


def progress_script(cap: int) -> str:
    """Shell (part of ``state_script``, after its loop has set ``$P``: the running jobs'
    ``ID/progress`` names, and ``o_ID``: where to read each from) that reads every such file's
    new bytes.  It prints, per file with news, a section ``progress:ID FROM,SIZE`` holding the
    file as it was before the read (``NAME %f %u %d:%i %w``) and dd's own count of the bytes it
    copied; then all the bytes read, one file after the other, as ``progress-bytes``; then the
    files as they are after the reads (``progress-check``).

    The parser (``parse_progress``) cuts the bytes by dd's counts and believes a file's only if
    both stats agree (a regular file of this account's, the same inode, born at the same
    nanosecond: an inode number freed by a swap and given to the next file does not pass, a
    line appended meanwhile does).  One ``stat`` before and one after, one ``dd`` (non-blocking,
    no link followed, ``cap`` bytes at most) per file with news and one ``tr`` for all of them,
    which shows every byte no progress line holds as '?': what a job writes keeps its length
    (dd's counts stay exact) and can never pass for one of the poll's marker lines, and the
    counts come from dd, which the job cannot make say anything else."""
    cap = int(cap)
    return (
        f'echo "{MARK} progress"\n'
        '[ -n "$P" ] && cd -- "$J" 2>/dev/null && {\n'
        '  X=$(stat -c "%n %f %u %d:%i %s %w" -- $P 2>/dev/null | {\n'
        '  while read -r n m u i s z; do j=${n%%/*}\n'
        '    case $j$s in *[!0-9]*) continue;; esac\n'
        '    [ "$u" = "$me" ] && [ $((0x$m & 61440)) = 32768 ] || continue\n'
        '    eval "o=\\${o_$j:-0}"; f=$o; [ "$s" -lt "$o" ] && f=0\n'
        f'    [ $((s - f)) -gt {cap} ] && f=$((s - {cap}))\n'
        '    [ "$s" -gt "$f" ] || continue\n'
        f'    printf "%s\\n" "{MARK} progress:$j $f,$s" "$n $m $u $i $z" >&4\n'
        '    LC_ALL=C dd if="$n" iflag=nonblock,nofollow,skip_bytes,count_bytes skip="$f" '
        'count=$((s - f)) bs=65536 2>&4\n'
        f"  done | LC_ALL=C tr -c '{_PROGRESS_CHARS}' '?'; echo x; }})\n"
        f'  echo "{MARK} progress-bytes"; printf "%s\\n" "${{X%x}}"\n'
        f'  echo "{MARK} progress-check"\n'
        '  stat -c "%n %f %u %d:%i %w" -- $P 2>/dev/null; } 4>&1\n'
        "true\n"
    )


def progress_cap(count: int, budget: int = PROGRESS_TOTAL) -> int:
    """Bytes one job's progress file may give one poll when ``count`` share ``budget``."""
    return max(512, min(PROGRESS_MAX, budget // max(1, count)))


def poll_script(workdir: str, expect: Expect = (), gpu_timeout_s: float = SMI_TIMEOUT_S,
                progress: Mapping[int, int] | None = None) -> str:
    """One remote poll: the expected jobs' states and new progress first (cheap, never blocked
    by the driver or by a job's files), then the GPUs.  One round trip per node per round,
    whatever the number of jobs."""
    return state_script(workdir, expect, progress) + gpu_script(gpu_timeout_s)


# ---------------------------------------------------------------- parsing its output
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
            job = RemoteJob(RemoteState.EXITED, _exit_code(parts[3]) if len(parts) > 3 else None,
                            pid,
                            reason=parts[4] if parts[4:5] in ([REQUEUE_ASKED], [MEM_LIMIT])
                            else None)
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
           only: tuple[int, ...] | None,
           util: Mapping[tuple[int, int], ProcessUtil] | None = None) -> tuple[GpuSample, ...]:
    """Put each process on its GPU (by uuid), tag iadeep's, give each its utilisation from
    ``util`` ((GPU index, pid) -> pmon's figures; none on a GPU in MIG mode, where the driver
    does not attribute utilisation to processes), keep only the inventory's GPUs."""
    by_uuid: dict[str, list[GpuProcess]] = {}
    for uuid, proc in apps:
        job_id = jobs.get(proc.pid)
        if job_id is not None:
            proc = replace(proc, job_id=job_id)
        by_uuid.setdefault(uuid, []).append(proc)
    out = []
    for row in rows:
        if only is not None and row.sample.index not in only:
            continue
        index, figures = row.sample.index, {} if row.mig else (util or {})
        procs = tuple(sorted((_with_util(p, figures.get((index, p.pid)))
                              for p in by_uuid.get(row.sample.uuid, ())), key=lambda p: p.pid))
        out.append(replace(row.sample, processes=procs))
    return tuple(out)


def _with_util(proc: GpuProcess, util: ProcessUtil | None) -> GpuProcess:
    return proc if util is None else replace(proc, sm_util=util.sm, mem_util=util.mem)


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

    def snap(gpus: tuple[GpuSample, ...] = (), error: str | None = None,
             driver: str | None = None) -> NodeSnapshot:
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
    util = parse_pmon(sec.get("pmon", (None, ""))[1])
    return snap(gpus=attach(rows, apps, jobs, only, util), driver=driver)

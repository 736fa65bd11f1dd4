"""Jobs and their explicit state machine.

    queued -> (held <-> queued) -> starting -> running -> succeeded | failed | cancelled
    starting/running -> lost (node silent past its grace period)
    lost -> running | succeeded | failed | cancelled (the node answers again and says which)
    lost -> queued (retries remain and the old attempt is known dead: the node answered and it
                    is gone, or an admin fenced the node)
    running <-> suspended (SIGSTOP/SIGCONT by run-time adaptation: its GPU ran worse than
                           serial); suspended -> an end, or lost, as running
    running -> queued (it checkpointed on its --checkpoint-signal and exited: requeued)

Every change goes through ``check_transition`` so an illegal move (cancelling a finished job,
starting a held one) is refused with a clear message instead of corrupting the queue.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import re
import shlex
import typing
from dataclasses import dataclass

from . import checks
from .errors import InputError, InvalidTransition


class JobState(str, enum.Enum):
    QUEUED = "queued"
    HELD = "held"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"               # stopped at its time limit (--time), as Slurm's TIMEOUT
    LOST = "lost"
    SUSPENDED = "suspended"           # stopped (SIGSTOP) on its GPU by run-time adaptation

    def __str__(self) -> str:  # so f-strings print 'queued', not 'JobState.QUEUED'
        return self.value


class StopReason(str, enum.Enum):
    """Why a job on a node is being stopped (``Job.stop_reason``, a column of its own), and the
    state that leads it to once its attempt has ended (``to_state``), as dstack's
    ``JobTerminationReason``. Who asked is ``Job.cancel_requested_by``, a person, and only for
    ``CANCELLED``: the controller's own reasons are these values, never a user name."""

    CANCELLED = "cancelled"        # its owner or an admin: `queue cancel`
    TIME_LIMIT = "time-limit"      # it ran past its --time (controller/round/steps/limits.py)
    IDLE = "idle"                  # its GPUs sat idle, lab.idle_action: cancel (steps/idle.py)
    IDLE_REQUEUE = "idle-requeue"  # ... idle_action: requeue: queued again (once) when it ends
    # an interactive job (`run --pty`) whose client was not heard from for lab.interactive_grace
    # (controller/round/steps/limits.py)
    CLIENT_GONE = "client-gone"

    def __str__(self) -> str:
        return self.value

    def to_state(self) -> JobState:
        """The state a stopped job ends in (one stopped to be queued again ends so only if it
        cannot be: its node was lost meanwhile, or it never started)."""
        return JobState.TIMEOUT if self is StopReason.TIME_LIMIT else JobState.CANCELLED

    @property
    def requeues(self) -> bool:
        """Whether the job goes back to the queue once its attempt has ended."""
        return self is StopReason.IDLE_REQUEUE


S = JobState
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.HELD, S.STARTING, S.CANCELLED}),
    # held -> starting: a job Slurm kept pending, held there too (`scontrol hold`), is released
    # back to Slurm, or Slurm had started it before the hold reached it.
    S.HELD: frozenset({S.QUEUED, S.CANCELLED, S.STARTING}),
    # starting -> queued: the launch provably never happened (e.g. node refused the upload).
    # starting -> held: a job Slurm keeps pending is held (in Slurm too).
    S.STARTING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.LOST, S.QUEUED,
                           S.HELD}),
    # running -> queued: it checkpointed on its --checkpoint-signal and exited; it starts again
    # where it fits, in the same working directory (controller/round/steps/adaptation.py).
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.LOST, S.SUSPENDED,
                          S.QUEUED}),
    # Suspended (steps/adaptation.py): resumed, or it ends or is lost just as a running job.
    S.SUSPENDED: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.LOST}),
    # A lost job may turn out to have finished once its node answers again, or be requeued.
    S.LOST: frozenset({S.QUEUED, S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMEOUT}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMEOUT: frozenset(),
}
ACTIVE = frozenset({S.STARTING, S.RUNNING, S.SUSPENDED})   # occupying GPUs on a node
PENDING = frozenset({S.QUEUED, S.HELD})              # waiting in the queue
FINISHED = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMEOUT})
UNFINISHED = tuple(s for s in S if s not in FINISHED)   # in the order summaries list them


def check_transition(job_id: int, old: JobState, new: JobState) -> None:
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(
            f"job {job_id} is {old}; it cannot become {new}",
            hint="see `iadeep queue show ID` for its current state",
        )


@dataclass(frozen=True)
class JobSpec:
    """What a user asks for with ``iadeep queue add`` (validated before it reaches the store)."""

    script: str                       # absolute path on the controller's machine
    args: tuple[str, ...] = ()
    name: str = ""
    gpus: int = 1
    mem_gib: float | None = None      # expected GPU memory per GPU; None: from the profile
    workload: str | None = None       # profile label; None: profile it on first run
    priority: int = 0
    exclusive: bool = False
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    retries: int = 0
    min_speed: float | None = None    # floor on predicted speed when sharing; None: lab default
    time_limit_s: float | None = None   # stopped once it has run this long (--time); None: never
    signal: str | None = None         # "USR1@60": sent that long before the time limit (--signal)
    notify: str = "none"              # when to tell its owner (--notify): see NOTIFY_WHEN
    # Submitting like sbatch (docs/submitting.md "Coming from Slurm"):
    submit_dir: str | None = None     # where `queue add` ran: the working directory on nodes
                                      # that share it (shared_paths; see run_dir)
    output: str | None = None         # --output: stdout's file (%j %u %x), relative to the
                                      # working directory; None: the job directory's log
    error: str | None = None          # --error: stderr's file; None: with stdout
    constraint: tuple[str, ...] = ()  # --constraint: node labels it needs (all of them)
    nodelist: tuple[str, ...] = ()    # --nodelist: only on one of these nodes
    exclude: tuple[str, ...] = ()     # --exclude: never on these nodes
    # --export: variables captured from the submitting shell (kept apart from --env, which
    # wins over them on the node; both are hidden from other users)
    exported: tuple[tuple[str, str], ...] = ()
    after: tuple[int, ...] = ()       # start once all these jobs succeeded (--after)
    after_any: tuple[int, ...] = ()   # ... once they ended, in any state (--after-any)
    after_fail: tuple[int, ...] = ()  # ... once they ended other than succeeded (--after-fail)
    array: str | None = None          # --array as written ("0-99%8"); every task keeps it
    retry_on_fail: bool = False       # --retries also after a non-zero exit (--retry-on-fail)
    no_adapt: bool = False            # --no-adapt: never suspended by run-time adaptation
    # --checkpoint-signal SIG: the job saves a checkpoint and exits on SIG; run-time adaptation
    # then sends it SIG instead of suspending it, and requeues it (steps/adaptation.py).
    checkpoint_signal: str | None = None
    # --requeue (`#SBATCH --requeue`): it checkpoints on its checkpoint signal (checkpoint_signal,
    # USR1 when none is given) and may be preempted: plan() may return it in Plan.preempt
    # (Policy.preemption; docs/scheduling.md)
    requeue: bool = False
    # --opportunistic: uses spare GPUs; the first suspended (or checkpointed) when a regular
    # job waits for its GPU (AntMan's idea; controller/round/steps/adaptation.py)
    opportunistic: bool = False
    # --idle-after: this job counts as idle after its GPUs sat idle this long (None: the lab's
    # idle_after; controller/round/steps/idle.py)
    idle_after_s: float | None = None
    # `iadeep run --pty`: the command has a terminal of its own on the node, its keystrokes
    # sent by its owner through the controller (requests/interactive.py); --time defaults to
    # the lab's interactive_time_limit
    interactive: bool = False
    hold: bool = False                # --hold (sbatch -H): queued held, until released
    begin_at: float | None = None     # --begin: not started before this time (epoch seconds)
    cpus_per_task: int | None = None  # --cpus-per-task: SLURM_CPUS_PER_TASK in the job
    # --mem (Slurm's: host RAM, MiB): a limit on the job's memory where its node can enforce it
    # (a memory cgroup; docs/submitting.md "Coming from Slurm")
    host_mem_mib: int | None = None


@dataclass(frozen=True)
class Attempt:
    """One try at running a job: where it was placed and what of it runs there, kept apart from
    what was asked (``JobSpec``) and from the job's own history (``Job``: its state, retries
    spent, orphans), as dstack keeps ``JobSpec``, ``JobSubmission`` and ``Job`` apart.

    A job going back to the queue (``store.jobrows.requeue``) or losing its placement drops its
    attempt whole: ``Attempt()`` is "no attempt", and a field added here is cleared with the
    others. ``Job`` keeps these fields flat (one column or ``extra`` key each, as stored);
    ``Job.attempt`` reads them as one value."""

    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    remote_pid: int | None = None     # its process group leader (SSH), or its Slurm job id
    remote_start: int | None = None   # the session leader's start time (ticks since boot)
    started_at: float | None = None
    signalled: bool = False           # it got its --signal before the time limit
    suspended_at: float | None = None   # see Job's run-time adaptation fields
    suspended_for: int | None = None
    suspended_s: float = 0.0
    checkpoint_at: float | None = None   # when its --checkpoint-signal was sent
    # asked to checkpoint and be requeued (``queue requeue``, the lab's preemption): by whom
    # or for which job ("job 7", "alice"), and when; the loop sends the signal (at most once)
    preempt_for: str | None = None
    preempt_at: float | None = None


ATTEMPT_FIELDS = tuple(f.name for f in dataclasses.fields(Attempt))


@dataclass(frozen=True)
class Job:
    """A job as stored: the spec plus who owns it and what has happened to it (its current
    try's fields, flat here, are read as one value by ``attempt``)."""

    id: int
    owner: str
    spec: JobSpec
    state: JobState
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    exit_code: int | None = None
    attempts: int = 0
    remote_pid: int | None = None
    remote_start: int | None = None   # the session leader's start time (ticks since boot)
    reason: str = ""                  # last transition's or wait's reason, for `queue why`
    observed_speed: float | None = None
    predicted_speed: float | None = None
    cancel_requested_by: str | None = None   # who asked to cancel it while it was on a node
    stop_reason: StopReason | None = None    # why it is being stopped (a column of its own)
    signalled: bool = False           # this attempt got its --signal before the time limit
    orphans: tuple[str, ...] = ()   # nodes where an abandoned attempt of it may still run
    array_id: int | None = None       # the array it is a task of (its first task's id)
    array_index: int | None = None    # its index in that array (IADEEP_ARRAY_INDEX)
    rerun_of: int | None = None       # the finished job it was submitted again from (rerun)
    # Run-time adaptation (steps/adaptation.py): when this attempt was last suspended (set
    # before the SIGSTOP is sent and cleared only after the SIGCONT is, so a crash in between
    # never leaves it stopped), for which partner job, and its seconds suspended so far (not
    # counted against --time).
    suspended_at: float | None = None
    suspended_for: int | None = None
    suspended_s: float = 0.0
    checkpoint_at: float | None = None   # when its --checkpoint-signal was sent (this attempt)
    checkpoints: int = 0              # attempts that ended in a checkpoint (not --retries')
    # this attempt was asked to checkpoint and be requeued (Attempt.preempt_for/preempt_at)
    preempt_for: str | None = None
    preempt_at: float | None = None
    # it waits again after a preemption or a requeue on request, as ``queue why`` says it
    # ("preempted for job 7 at 14:02; requeued"); cleared when it is placed again (the
    # events keep it)
    preempted: str = ""
    # (GPU, job) it was last checkpointed off: that GPU takes no new partner while that job
    # is still there, so a restarted controller too keeps it from rejoining a bad pair
    yielded: tuple[str, int] | None = None
    # steps/idle.py: since when this attempt's GPUs have been idle (set once it counts as
    # idle, its owner told), and whether idleness already requeued it (that happens once)
    idle_since: float | None = None
    idle_requeued: bool = False
    idle_marked: bool = False   # it is marked idle now (its GPUs have not been busy since)

    @property
    def name(self) -> str:
        return self.spec.name or self.spec.script.rsplit("/", 1)[-1]

    @property
    def attempt(self) -> Attempt:
        """Its current try (``Attempt()`` when it is placed nowhere)."""
        return Attempt(**{name: getattr(self, name) for name in ATTEMPT_FIELDS})

    def orphans_with(self, node: str | None) -> tuple[str, ...]:
        """``orphans`` plus ``node``: an abandoned attempt may still run there (the controller
        stops it when the node answers again, and places no new attempt there before)."""
        return self.orphans if not node or node in self.orphans else (*self.orphans, node)

    def orphans_without(self, node: str) -> tuple[str, ...]:
        return tuple(n for n in self.orphans if n != node)


# --notify: which of a job's moments send its owner a message. 'end': it reached a final state;
# 'fail': a final state other than succeeded (failed, cancelled, or stopped at its time limit);
# 'all': its start too; 'none': never.
NOTIFY_WHEN = ("end", "fail", "all", "none")
MAX_GPUS_PER_JOB = 64
MAX_TIME_LIMIT_S = 365 * 86400
# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
MAX_HOST_MEM_MIB = 64 * 1024**2   # --mem as host RAM: 64 TiB
MAX_MEM_GIB = 4096.0          # GiB per GPU; no GPU comes close (and --mem in MiB is caught)
PRIORITY_LIMIT = 1_000_000
MAX_RETRIES = 100
MAX_NAME = 200                # --name, --workload
MAX_PATH = 4096               # the script's path, --workdir (Linux's PATH_MAX)
# `iadeep run --pty`: the FIFO in the job's directory its script reads keystrokes from, and the
# most bytes one keystroke batch may hold (a pipe's atomic write: a batch is never split).
TTY_INPUT = "tty-in"
MAX_INPUT = 4096
MAX_NAMES = 256               # labels or node names in one --constraint/--nodelist/--exclude
NODE_WORD = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.:+=/@-]{0,199}")
# Arguments and --env values reach the node inside one shell command line, shell-quoted;
# Linux refuses a single argument over 128 KiB, and iadeep's own part needs room.
MAX_COMMAND_BYTES = 64 * 1024


# Variables that change how a program loads or starts, refused in --env and --export on every
# backend (docs/security.md): a job's variables must reach only the job, and one that
# reached a privileged program by mistake (a root `sbatch`, sudo, a shell) would run a member's
# code there. The dynamic loader's (LD_*, and glibc's list of variables it ignores for setuid
# programs, TMPDIR aside), the shells' start-up and parsing, the interpreters' code paths and
# option hooks, OpenSSL's and terminfo's files. A job script sets any of them for itself.
UNSAFE_ENV_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_", "PYTHON")
UNSAFE_ENV = frozenset({
    # glibc: unsecvars.h
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
    "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR",
    "PATH_LOCALE",
    # shells: files read at start, options, how a line is split or traced
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "CDPATH", "GLOBIGNORE", "FPATH",
    "ZDOTDIR", "NULLCMD", "READNULLCMD", "TMPPREFIX", "PROMPT_COMMAND", "BASH_XTRACEFD",
    "BASH_LOADABLES_PATH", "EXECIGNORE",
    # other interpreters' code paths and start-up options
    "PERL5LIB", "PERLLIB", "PERL5OPT", "PERL5DB", "PERLIO_DEBUG", "RUBYLIB", "RUBYOPT",
    "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
    # libraries that load modules or parse files named here
    "OPENSSL_CONF", "OPENSSL_ENGINES", "OPENSSL_MODULES", "TERMINFO", "TERMINFO_DIRS",
    "TERMCAP", "TERMPATH",
})
# Python's variables that only switch behaviour (no code or path): allowed despite PYTHON*
SAFE_PYTHON_ENV = frozenset({"PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
                             "PYTHONNOUSERSITE", "PYTHONFAULTHANDLER", "PYTHONIOENCODING",
                             "PYTHONUTF8"})


def unsafe_env(name: str) -> bool:
    """Whether ``name`` is a variable a job may not be given (``UNSAFE_ENV``)."""
    return name not in SAFE_PYTHON_ENV and (name in UNSAFE_ENV
                                            or name.startswith(UNSAFE_ENV_PREFIXES))


def check_env_names(pairs: typing.Iterable[tuple[str, str]], option: str = "--env") -> None:
    """InputError (one line) for the first name that is not a variable name or is unsafe."""
    for key, _ in pairs:
        if not key.isidentifier() or not key.isascii():
            raise InputError(f"bad {option} name {key[:80]!r}: not a valid variable name",
                             hint=f"use {option} NAME=VALUE with NAME made of letters, digits "
                                  "and _")
        if unsafe_env(key):
            raise InputError(f"{option} {key}: iadeep does not pass variables that change how "
                             "programs load or start (the dynamic loader's, shell start-up, "
                             "interpreters' paths; docs/security.md)",
                             hint=f"set it inside the job script instead (export {key}=...)")


# Dependencies (--after, --after-any, --after-fail) a job may name, after an array's id is
# expanded to its tasks' ids; an array may have at most this many tasks (every task is a row).
MAX_DEPENDENCIES = MAX_ARRAY_TASKS = 10_000
MAX_ARRAY_INDEX = 4_000_000   # as Slurm's MaxArraySize ceiling
_ARRAY_PART = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


@dataclass(frozen=True)
class ArraySpec:
    """``--array`` parsed: the task indices (ascending, each once) and the most that may run
    at once (``%N``; None: no limit)."""

    indices: tuple[int, ...]
    limit: int | None


@functools.cache
def parse_array(text: str) -> ArraySpec:
    """``--array`` as sbatch takes it: ``0-99``, ``1,3,5``, ``0-99:2`` (every 2nd), with
    ``%8`` at the end for at most 8 tasks running at once. Refused past MAX_ARRAY_TASKS tasks,
    so one submission cannot fill the database."""
    hint = "e.g. --array 0-99, --array 1,3,5 or --array 0-99%8 (at most 8 at once)"
    body, pct, limit_text = text.strip().partition("%")
    if pct and not (limit_text.isdigit() and 0 < int(limit_text) <= MAX_ARRAY_TASKS):
        raise InputError(f"--array {text[:40]!r}: the limit after % must be a number from 1 to "
                         f"{MAX_ARRAY_TASKS}", hint=hint)
    indices: set[int] = set()
    for part in body.split(","):
        m = _ARRAY_PART.fullmatch(part.strip())
        if m is None:
            raise InputError(f"--array {text[:40]!r} is not a list of indices and ranges",
                             hint=hint)
        first, last, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
        if last < first or step < 1 or last > MAX_ARRAY_INDEX:
            raise InputError(f"--array {text[:40]!r}: {part.strip()} is not an ascending range "
                             f"of indices up to {MAX_ARRAY_INDEX}", hint=hint)
        if len(indices) + (last - first) // step + 1 > MAX_ARRAY_TASKS:
            raise InputError(f"--array {text[:40]!r} has more than {MAX_ARRAY_TASKS} tasks",
                             hint="split it into several arrays, or give each task more work")
        indices.update(range(first, last + 1, step))
    return ArraySpec(tuple(sorted(indices)), int(limit_text) if pct else None)


def parse_job_ids(text: str, option: str) -> tuple[int, ...]:
    """``--after 12,13`` into job ids."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and 0 < int(p) < 2**62 for p in parts):
        raise InputError(f"{option} {text[:40]!r} is not a list of job ids",
                         hint=f"e.g. {option} 12 or {option} 12,13")
    return tuple(int(p) for p in parts)


def dependencies(spec: JobSpec) -> tuple[tuple[str, int], ...]:
    """A spec's dependencies as (option, job id) pairs, in the order they are checked."""
    return (*(("--after", i) for i in spec.after), *(("--after-fail", i) for i in spec.after_fail),
            *(("--after-any", i) for i in spec.after_any))


def check_priority(priority: int) -> None:
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        raise InputError(f"--priority must be between -{PRIORITY_LIMIT} and {PRIORITY_LIMIT}, "
                         f"got {priority}", hint="e.g. --priority 5 (higher runs first)")


def parse_idle_after(text: str) -> float:
    """``--idle-after``: a duration as ``--time`` takes it (a bare number is minutes)."""
    from .text import DURATION_FORMS, parse_duration

    seconds = parse_duration(text, bare_s=60)
    if seconds is None:
        raise InputError(f"--idle-after {text[:40]!r} is not a duration",
                         hint=f"write {DURATION_FORMS}; a bare number is minutes")
    return seconds


def parse_time_limit(text: str) -> float:
    """A time limit in seconds, written as Slurm's ``--time`` takes it (``90`` minutes, ``90:30``
    M:S, ``2:00:00``, ``3-0``, ``1-12:30``, ``1-12:30:00``: a lab moving from Slurm keeps its
    habits and its job scripts' values) or as nodes.yaml does (``8d``, ``12h``, ``30m``)."""
    from .text import DURATION_FORMS, parse_duration

    seconds = parse_duration(text, bare_s=60)
    if seconds is None:
        raise InputError(f"--time {text[:40]!r} is not a time limit",
                         hint=f"write {DURATION_FORMS}; a bare number is minutes, as sbatch "
                              "--time takes it")
    return seconds


# Signals a job may ask for before its time limit (--signal): the ones programs catch to
# checkpoint or wind down; never KILL or STOP, which cannot be caught.
SIGNALS = ("HUP", "INT", "QUIT", "USR1", "USR2", "ALRM", "TERM")
DEFAULT_SIGNAL_LEAD_S = 60            # as Slurm's --signal without @


def parse_signal(text: str) -> tuple[str, int]:
    """``--signal`` as sbatch takes it, ``[B:]SIG[@SECONDS]``: (the signal's name, how many
    seconds before the time limit to send it). ``B:`` (sbatch's: the batch shell alone, not
    the programs it started) stays on the name, ``B:USR1``: ``Backend.signal`` takes it so."""
    name, at, lead = text.strip().partition("@")
    batch = name[:2].upper() == "B:"
    name = name[2:] if batch else name
    name = name.upper().removeprefix("SIG")
    if name not in SIGNALS or (at and not lead.isdigit()) or len(lead) > 7:
        raise InputError(f"--signal {text[:40]!r} is not [B:]SIGNAL[@SECONDS]",
                         hint=f"e.g. --signal USR1@120; signals: {', '.join(SIGNALS)}")
    return ("B:" if batch else "") + name, int(lead) if lead else DEFAULT_SIGNAL_LEAD_S


def parse_checkpoint_signal(text: str) -> str:
    """``--checkpoint-signal SIG``: the signal's name (one of SIGNALS), as ``--signal`` takes it
    but without ``@``: it is sent when run-time adaptation needs the GPU, not before a limit."""
    name = text.strip().upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise InputError(f"--checkpoint-signal {text[:40]!r} is not a signal it may get",
                         hint=f"e.g. --checkpoint-signal USR1; signals: {', '.join(SIGNALS)}")
    return name


# A job without --workload is labelled after its program: the script's file name, its owner,
# and the first hex digits of its content's SHA-256 (``train.py@alice:3f9a1c``). Two members'
# ``train.py``, or one member's two different ``train.py``, get two labels and two profiles;
# the same script submitted again gets the same label. The arguments are not part of it (the
# same script with other hyperparameters is the same program); ``--workload`` names a label
# to share across scripts or members, or to separate runs of one script.
PROGRAM_DIGEST_HEX = 6
PROGRAM_LABEL = re.compile(
    rf"(?P<name>.+)@(?P<owner>[^@:/\s]+):(?P<digest>[0-9a-f]{{{PROGRAM_DIGEST_HEX}}})")


def program_label(script: str, content: bytes, owner: str) -> str:
    """The label of a job submitted without --workload: ``<script file>@<owner>:<digest>``."""
    name = script.rsplit("/", 1)[-1][:MAX_NAME // 2] or "script"
    digest = hashlib.sha256(content).hexdigest()[:PROGRAM_DIGEST_HEX]
    return f"{name}@{owner}:{digest}"


def label_origin(workload: str | None, script: str | None = None,
                 owner: str | None = None) -> str:
    """Why a job has its label (or what a profile's label is), as a sentence part for
    ``queue why`` and ``profile show``."""
    if workload is None:
        return ("none yet: queued before labels named programs, it is labelled after its "
                "script's name when profiled")
    m = PROGRAM_LABEL.fullmatch(workload)
    if m and (script is None or m["name"] == script.rsplit("/", 1)[-1][:MAX_NAME // 2]) \
            and (owner is None or m["owner"] == owner):
        return (f"its program's: script {m['name']} of {m['owner']}, content sha256 "
                f"{m['digest']}..., given to a job submitted without --workload (the same "
                "script submitted again shares it; --workload NAME shares one across scripts)")
    if script is None:   # a profile's label, no job's
        return ("a --workload label, or a script's name (profiles from before labels named "
                "programs)")
    if workload == script.rsplit("/", 1)[-1].rsplit(".", 1)[0]:
        return ("given with --workload, or its script's name (jobs queued before labels named "
                "programs)")
    return "given with --workload"


DEFAULT_CHECKPOINT_SIGNAL = "USR1"   # a --requeue job's, when it names none


def checkpoint_signal_of(spec: JobSpec) -> str | None:
    """The signal a job checkpoints on: its --checkpoint-signal, else USR1 for a --requeue
    job; None: it does not checkpoint (run-time adaptation suspends it instead)."""
    return spec.checkpoint_signal or (DEFAULT_CHECKPOINT_SIGNAL if spec.requeue else None)


def validate_spec(spec: JobSpec) -> None:
    """Refuse a spec that could never run, with a message naming the field (trust boundary:
    the controller calls this again on everything a client sends). Text must be printable: a
    NUL byte makes sshd drop the node's connection at every launch, and an escape sequence in
    a name would reach other users' terminals; arguments and --env values may hold tabs and
    newlines (they are quoted on their way to the node)."""
    def bad(msg: str, hint: str) -> InputError:
        return InputError(msg, hint=hint)

    if not 1 <= spec.gpus <= MAX_GPUS_PER_JOB:
        raise bad(f"--gpus must be between 1 and {MAX_GPUS_PER_JOB}, got {spec.gpus}",
                  "ask for the number of GPUs the job uses, e.g. --gpus 1")
    if spec.mem_gib is not None and not 0 < spec.mem_gib <= MAX_MEM_GIB:
        raise bad(f"--gpu-mem must be a positive number of GiB up to {MAX_MEM_GIB:g}, got "
                  f"{spec.mem_gib}", "give the GPU memory one GPU of the job needs, e.g. "
                  "--gpu-mem 12")
    if not 0 <= spec.retries <= MAX_RETRIES:
        raise bad(f"--retries must be between 0 and {MAX_RETRIES}, got {spec.retries}",
                  "e.g. --retries 2")
    if spec.min_speed is not None and not 0 < spec.min_speed <= 1:
        raise bad(f"--min-speed must be in (0, 1], got {spec.min_speed}",
                  "1.0 means never share; 0.5 accepts half speed")
    if spec.time_limit_s is not None and not 0 < spec.time_limit_s <= MAX_TIME_LIMIT_S:
        raise bad(f"--time must be more than 0 and at most {MAX_TIME_LIMIT_S // 86400} days, got "
                  f"{spec.time_limit_s:g} s", "e.g. --time 2:00:00 (two hours) or --time 3-0")
    if spec.idle_after_s is not None and not 0 < spec.idle_after_s <= MAX_TIME_LIMIT_S:
        raise bad(f"--idle-after must be more than 0 and at most {MAX_TIME_LIMIT_S // 86400} "
                  f"days, got {spec.idle_after_s:g} s", "e.g. --idle-after 2h")
    if spec.signal is not None:
        parse_signal(spec.signal)
    if spec.host_mem_mib is not None and not 1 <= spec.host_mem_mib <= MAX_HOST_MEM_MIB:
        raise bad(f"--mem (host RAM) must be from 1M to {MAX_HOST_MEM_MIB // 1024**2}T, got "
                  f"{spec.host_mem_mib}M", "e.g. --mem 16G (host RAM, as in Slurm)")
    if spec.cpus_per_task is not None and not 1 <= spec.cpus_per_task <= 4096:
        raise bad(f"--cpus-per-task must be from 1 to 4096, got {spec.cpus_per_task}",
                  "e.g. --cpus-per-task 8")
    if spec.checkpoint_signal is not None:
        parse_checkpoint_signal(spec.checkpoint_signal)
    if spec.requeue and spec.interactive:
        raise bad("an interactive job (run --pty) cannot be requeued: its terminal would not "
                  "come back", "drop --requeue, or submit it with `iadeep queue add`")
    if spec.notify not in NOTIFY_WHEN:
        raise bad(f"--notify must be one of {', '.join(NOTIFY_WHEN)}, got {spec.notify[:40]!r}",
                  "e.g. --notify fail (a message if it does not succeed)")
    check_priority(spec.priority)
    for label, value, limit in (("--output", spec.output, MAX_PATH),
                                ("--error", spec.error, MAX_PATH)):
        if value is not None:
            checks.text(label, value, max_len=limit, hint="e.g. --output train-%j.out")
            if not value:
                raise bad(f"{label} needs a file name", hint=f"e.g. {label} train-%j.out")
    if spec.submit_dir is not None:
        checks.text("the submission directory", spec.submit_dir, max_len=MAX_PATH,
                    hint="submit from a directory whose path is printable")
        if not spec.submit_dir.startswith("/"):
            raise bad(f"the submission directory must be absolute, got {spec.submit_dir[:200]!r}",
                      "the CLI sends its working directory; pass an absolute path to the API")
    for label, names in (("--constraint", spec.constraint), ("--nodelist", spec.nodelist),
                         ("--exclude", spec.exclude)):
        if len(names) > MAX_NAMES:
            raise bad(f"{label} names {len(names)} labels or nodes; at most {MAX_NAMES}",
                      "name fewer (labels describe groups of nodes)")
        for name in names:
            if not NODE_WORD.fullmatch(name):
                raise bad(f"{label}: {name[:80]!r} is not a node label or name",
                          "use letters, digits, '.', '_' and '-', e.g. --constraint a100&nvlink")
    deps = dependencies(spec)
    if len(deps) > MAX_DEPENDENCIES:
        raise bad(f"a job may depend on at most {MAX_DEPENDENCIES} jobs, got {len(deps)}",
                  "make the jobs one array and depend on the array's id")
    for option, dep in deps:
        if dep < 1:
            raise bad(f"{option} {dep} is not a job id", f"e.g. {option} 12")
    if spec.array is not None:
        parse_array(spec.array)
    check_env_names(spec.exported, "--export")
    check_env_names(spec.env)
    if not spec.script.startswith("/"):
        raise bad(f"script path must be absolute, got {spec.script[:200]!r}",
                  "the CLI resolves relative paths; pass an absolute path to the API")
    checks.text("the script's path", spec.script, max_len=MAX_PATH,
                hint="rename the script (or its folder) to printable characters")
    if spec.script.rsplit("/", 1)[-1] in ("", ".", ".."):
        raise bad(f"script path {spec.script[:200]!r} does not name a file",
                  "give the path of the script file itself")
    checks.text("--name", spec.name, max_len=MAX_NAME, hint="e.g. --name resnet-lr3")
    for label, value, limit in (("--workload", spec.workload, MAX_NAME),
                                ("--workdir", spec.workdir, MAX_PATH)):
        if value is not None:
            checks.text(label, value, max_len=limit, hint="use printable text")
    for label, value in (*((f"argument {i}", a) for i, a in enumerate(spec.args, 1)),
                         *((f"--env {k}", v) for k, v in spec.env),
                         *((f"--export {k}", v) for k, v in spec.exported)):
        checks.text(label, value, max_len=MAX_COMMAND_BYTES, multiline=True,
                    hint="pass binary data in a file the script reads")
    words = (*spec.args, *(f"{k}={v}" for k, v in (*spec.exported, *spec.env)))
    size = sum(len(shlex.quote(w).encode()) + 1 for w in words)
    if size > MAX_COMMAND_BYTES:
        raise bad(f"the arguments and --env values take {size // 1024} KiB on the node's command "
                  f"line (quoted); at most {MAX_COMMAND_BYTES // 1024} KiB fit",
                  "pass large inputs in a file that the script reads")


INTERPRETERS = {".py": "#!/usr/bin/env python3", ".pl": "#!/usr/bin/env perl",
                ".rb": "#!/usr/bin/env ruby", ".jl": "#!/usr/bin/env julia"}


def check_interpreter(path) -> None:
    """A job script is executed directly on its node; without a ``#!`` line the shell would
    run a Python file as shell commands, failing in confusing ways an hour into the queue."""
    from pathlib import Path

    from .errors import InputError

    suffix = Path(path).suffix
    if suffix not in INTERPRETERS:
        return
    with open(path, "rb") as f:
        first = f.readline(256)
    if not first.startswith(b"#!"):
        raise InputError(f"script {str(path)!r} has no '#!' first line, so the node would run it "
                         "with sh", hint=f"add '{INTERPRETERS[suffix]}' as its first line")


def parse_env(items: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``["K=V", ...]`` from the command line into pairs, with a clear error for a bad one."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"bad --env {item!r}: expected NAME=VALUE",
                             hint="e.g. --env LR=0.1 (quote values with spaces)")
        out.append((key, value))
    return tuple(out)


def spec_to_dict(spec: JobSpec) -> dict:
    from dataclasses import asdict
    return asdict(spec)


def spec_from_dict(data: object) -> JobSpec:
    """Rebuild a spec sent over the socket; every field is checked against its annotation
    (unknown, missing or mistyped fields are an InputError)."""
    hint = "upgrade the iadeep client to the controller's version"
    if not isinstance(data, dict):
        raise InputError("malformed request: spec must be an object", hint=hint)
    fields = _spec_fields()
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise InputError(f"malformed request: spec has an unknown field {unknown[0][:40]!r}",
                         hint="a newer client's option this controller does not know: upgrade "
                              "the controller, or leave the option out")
    if "script" not in data:
        raise InputError("malformed request: spec.script is missing", hint=hint)
    return JobSpec(**{k: checks.typed(f"spec.{k}", v, fields[k]) for k, v in data.items()})


# The JobSpec fields a submission may leave to the lab: absent from the submission, they take
# the inventory's value (``SubmitSpec.resolve``: lab.default_retries, lab.notify.default). Any
# other absent field takes JobSpec's own default.
LAB_DEFAULTED = ("retries", "notify")


@dataclass(frozen=True)
class SubmitSpec:
    """A job's spec as `queue add` sends it (``messages.AddRequest.spec``): the fields given,
    and which of ``LAB_DEFAULTED`` the submitter left to the lab (``lab_defaults``; whatever
    ``spec`` holds for those is a placeholder, never sent).

    On the wire: JobSpec's fields by name (``to_dict``/``from_dict``), under the protocol's
    rule (messages.py): an unknown key is refused with an error naming it, never dropped (a
    newer client's option, ignored, would run the job otherwise than asked), and a missing key
    takes its default, so an older client's spec, without the fields added since, still
    works. ``to_dict`` leaves out the fields at JobSpec's default, so a newer client reaches
    an older controller too while it uses no option that controller lacks."""

    spec: JobSpec
    lab_defaults: frozenset[str] = frozenset()

    @classmethod
    def of(cls, spec: JobSpec, *, retries: int | None = None, notify: str | None = None
           ) -> SubmitSpec:
        """``spec`` with the ``LAB_DEFAULTED`` fields the submitter gave (None: not given, the
        lab's default applies)."""
        given: dict[str, typing.Any] = {k: v for k, v in (("retries", retries),
                                                          ("notify", notify)) if v is not None}
        return cls(dataclasses.replace(spec, **given), frozenset(LAB_DEFAULTED) - given.keys())

    def gave(self, name: str) -> bool:
        """Whether the submitter chose field ``name`` (not left to the lab)."""
        return name not in self.lab_defaults

    def resolve(self, *, retries: int, notify: str) -> JobSpec:
        """The spec to queue: the lab's ``retries``/``notify`` where the submitter left them."""
        lab: dict[str, typing.Any] = {"retries": retries, "notify": notify}
        return dataclasses.replace(self.spec, **{k: lab[k] for k in self.lab_defaults})

    def to_dict(self) -> dict:
        defaults = _spec_defaults()
        return {k: v for k, v in spec_to_dict(self.spec).items()
                if k not in self.lab_defaults
                and (k == "script" or k in LAB_DEFAULTED or v != defaults[k])}

    @classmethod
    def from_dict(cls, data: object) -> SubmitSpec:
        """A submission from an untrusted client: ``spec_from_dict``'s checks (an InputError
        naming an unknown, missing or mistyped field)."""
        spec = spec_from_dict(data)
        sent = data.keys() if isinstance(data, dict) else ()   # a dict: spec_from_dict checked
        return cls(spec, frozenset(k for k in LAB_DEFAULTED if k not in sent))


@functools.cache
def _spec_fields() -> dict[str, object]:
    return typing.get_type_hints(JobSpec)


@functools.cache
def _spec_defaults() -> dict[str, object]:
    """Each JobSpec field's default (the script, which has none: absent)."""
    return {f.name: f.default for f in dataclasses.fields(JobSpec)
            if f.default is not dataclasses.MISSING}

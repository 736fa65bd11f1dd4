"""The one seam between the controller and the ways a job runs on a node: ``Backend``.

The controller decides (what runs where, when it stops); a backend carries it out on one node
and reports what is there. The node pool hands each node's backend to the controller
(``Pool.backend(name)``), which never imports an implementation. Two exist:

- ``nodes/shell/``: a POSIX shell on the node, over SSH (or on the controller's own machine):
  a job directory per job, started detached with ``setsid``, found again by its pid file and
  the variables it carries (``BackendKind.SSH``).
- ``nodes/slurm/``: ``sbatch`` into a Slurm partition, pinned to the node and GPU that
  ``plan()`` chose; Slurm starts, signals and accounts for the job (``BackendKind.SLURM``).

docs/backends.md says what a third one must implement, and tests/integration/
test_backend_contract.py checks every contract written below against both real backends.

Rules every backend keeps (the controller relies on them):

- Crash safety: the controller may die between any two calls, or in the middle of one, and
  calls again after a restart. So ``launch`` never starts one attempt twice (the backend's own
  record of the launch is the lock), every stop is idempotent, and ``states`` tells the truth
  about a job whatever the controller recorded.
- Failure: a node that cannot be reached, or a command that fails, raises ``NodeError`` (one
  line, naming the node); bad input from a user raises ``InputError``. Never a library's own
  exception, never a traceback.
- Security: every value a user chose reaches a shell only quoted; on a node that runs jobs as
  their submitters (``Node.submitter``) everything touching a job runs as its ``owner``.
- Calls may come from several threads at once, but never two for one job at once (the
  controller serialises each node's actions on one worker).
"""
from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import NotFoundError
from ..jobs import Job
from ..settings import BackendKind
from ..snapshot import RemoteJob
from .gpu import Expect  # (job id, recorded pid or backend job id, recorded start time)

__all__ = ["FEATURES", "MAX_LOG_READ", "OPEN_FAILED", "OPEN_FAILED_LINE", "Backend", "Features",
           "LaunchResult", "LogBytes", "Stopped", "features", "log_bytes"]

# A job whose --output/--error cannot be opened fails before it runs, with this exit code and
# the reason in its log on a line of its own after OPEN_FAILED_LINE (the controller reads it
# into the failure reason).
OPEN_FAILED = 122
OPEN_FAILED_LINE = "iadeep: cannot open the job's output: "
MAX_LOG_READ = 1 << 20      # bytes per log read: the controller's to bound, not the caller's
# `iadeep run --pty`'s FIFO and the most bytes one ``write_input`` takes: see jobs.py.


class Stopped:
    """What ``Backend.cancel`` found (plain strings: they are logged and compared as such)."""

    TERMINATED = "terminated"     # it ended on TERM (or the backend's own stop)
    KILLED = "killed"             # it had to be killed after the grace period
    NOT_RUNNING = "not-running"   # it had been launched and had already ended
    MISSING = "missing"           # nothing of it is there: never launched, or long gone


@dataclass(frozen=True)
class LaunchResult:
    pid: int                        # what identifies the attempt: the session leader's pid
    pgid: int                       # (shell), or the backend's own job id (Slurm)
    job_dir: str                    # where its files are on the node ('' if none)
    already_started: bool = False   # True: an earlier launch of it was found; nothing started
    start: int | None = None        # the session leader's start time (ticks since boot)
    waiting: bool = False           # the backend's queue has it, not started yet (see
    #                                 ``Backend.keeps_jobs_pending``); ``pid`` is its id there


@dataclass(frozen=True)
class LogBytes:
    """Bytes of a job's log as read from its node: the bytes, the offset where the next read
    starts, and the log's size.  ``messages.LogChunk`` is what a client gets: see ``text``."""

    data: bytes
    offset: int
    size: int

    def text(self) -> tuple[str, int, int]:
        """(text, next offset, size): text ending at a whole UTF-8 character (a character cut by
        the read's limit comes whole with the next read, so the offset stops before it)."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(self.data, final=self.offset >= self.size)
        pending = len(decoder.getstate()[0])
        return text, self.offset - pending, self.size


def log_bytes(got: tuple[bytes, int] | None, job_id: int, node: str, path: str, offset: int,
              stream: str) -> LogBytes:
    """What a backend's read of a job's log gave, as ``LogBytes``; NotFoundError if there was
    none."""
    if got is None:
        raise NotFoundError(f"job {job_id} has no {'log' if stream == 'output' else 'stderr'} "
                            f"on node {node} ({path})",
                            hint="the job may not have started yet; see `iadeep queue show ID`")
    data, size = got
    return LogBytes(data, offset + len(data), size)


@dataclass(frozen=True)
class Features:
    """What one kind of backend can do beyond the common contract, and the words people know
    it by: each ``Backend`` of that kind has the same flags (``Backend.keeps_jobs_pending``
    ...; a unit test holds them equal), and the controller, which never asks which backend a
    node has, decides by these (``features(node.backend)``: the service holds no backend, only
    the inventory). A new backend adds its row to ``FEATURES`` (docs/backends.md)."""

    label: str                 # how messages name it: "{label} node n1", "submitted to {label}"
    keeps_jobs_pending: bool   # see ``Backend``
    progress_in_poll: bool
    job_dirs: bool
    interactive: bool
    # Every job runs as its owner's account (the backend's own check: a node's ``run_as`` does
    # not apply), so an owner with no account there, or root, is refused at submission.
    runs_as_owner: bool = False
    # The backend's pool polls these nodes itself; the SSH poller reads one only for its GPUs'
    # telemetry, when the node is listed under ``nodes:`` too (``Node.ssh_telemetry``).
    polls_itself: bool = False
    hold_command: str = ""     # what holds a pending job there, and releases it (for messages)
    release_command: str = ""
    terminal_instead: str = ""   # what its users run for a terminal instead of `run --pty`


FEATURES: dict[BackendKind, Features] = {
    BackendKind.SSH: Features("SSH", keeps_jobs_pending=False, progress_in_poll=True,
                              job_dirs=True, interactive=True),
    BackendKind.SLURM: Features("Slurm", keeps_jobs_pending=True, progress_in_poll=False,
                                job_dirs=False, interactive=False, runs_as_owner=True,
                                polls_itself=True, hold_command="scontrol hold",
                                release_command="scontrol release",
                                terminal_instead="srun --pty"),
}


def features(kind: BackendKind | str) -> Features:
    """The capabilities of backend ``kind`` (a ``Node.backend``)."""
    return FEATURES[BackendKind(kind)]


class Backend(Protocol):
    """Job control on ONE node (``node``), as its pool hands it out (``Pool.backend``).

    ``owner`` (the job's submitter) is needed wherever a job is touched on a node that runs
    jobs as their submitters; elsewhere it may be None. Methods that take only a job id act
    on the job's current attempt on this node.
    """

    kind: BackendKind
    node: str

    # Capabilities: what the controller may expect beyond the common contract.
    keeps_jobs_pending: bool
    """The backend has a queue of its own that may keep a launched job waiting: ``launch``
    may return ``waiting=True``, ``states`` may say ``pending`` (with the queue's reason), and
    ``hold``/``release`` act on the job there. False: a launched job runs at once, ``hold``
    and ``release`` do nothing (a held job is simply never launched) and return False."""
    progress_in_poll: bool
    """The pool's poll reads each running job's new progress bytes itself
    (``NodeSnapshot.progress``). False: the controller reads them with ``read_progress``."""
    job_dirs: bool
    """Each attempt leaves a directory of its own on the node that ``set_aside`` renames and
    ``clean`` removes. False: attempts are named apart by the backend (both do nothing)."""
    interactive: bool
    """``write_input`` reaches a running job's terminal (``iadeep run --pty``: its script reads
    keystrokes from the FIFO ``TTY_INPUT`` in its job directory). False: it raises NodeError,
    and the controller refuses `--pty` jobs that could be placed here."""

    def launch(self, job: Job, gpu_indices: Sequence[int], script: str | Path) -> LaunchResult:
        """Start ``job``'s current attempt (``job.attempts``) on ``gpu_indices`` of this node,
        running ``script`` (a file on the controller's machine) with ``job.spec.args``,
        ``job.spec.env``/``exported`` and iadeep's variables (CUDA_VISIBLE_DEVICES or the
        backend's GPU binding, IADEEP_JOB_ID, IADEEP_JOB_NAME, IADEEP_PROGRESS_FILE,
        IADEEP_RESTART_COUNT, IADEEP_CHECKPOINT_SIGNAL for a job that has one).

        Exactly once: a second call for the same attempt (after a crash, or racing another
        controller) finds the first and returns it with ``already_started=True``, starting
        nothing. Returns once the job is started (or, ``waiting``, queued in the backend).
        NotFoundError: the script is gone; InputError: the job cannot run here as given
        (nothing started); NodeError: whether it started is unknown (``states`` tells)."""
        ...

    def cancel(self, job_id: int, grace_s: float = 10.0, owner: str | None = None) -> str:
        """Stop every process of the job: TERM, then KILL after ``grace_s`` (or the backend's
        own equivalent); a suspended job is stopped too. Idempotent and safe on a job that
        ended or was never launched. Returns a ``Stopped`` value."""
        ...

    def signal(self, job_id: int, name: str, owner: str | None = None) -> bool:
        """Send signal ``name`` (one of ``jobs.SIGNALS``, else InputError) once to each process
        of the job; ``B:NAME`` (sbatch's --signal=B:) to its batch script alone. The job is
        not otherwise touched. True if anything of it was there."""
        ...

    def suspend(self, job_id: int, owner: str | None = None) -> bool:
        """Stop the job where it is (SIGSTOP, or the backend's own suspend), holding its GPU
        memory. Idempotent. True if anything of it was there."""
        ...

    def resume(self, job_id: int, owner: str | None = None) -> bool:
        """Continue a suspended job (SIGCONT, or the backend's own resume). Idempotent; a job
        that was not suspended is left alone. True if anything of it was there."""
        ...

    def hold(self, job_id: int, owner: str | None = None) -> bool:
        """Keep the job waiting in the backend's queue (``keeps_jobs_pending``). Idempotent:
        a job already held, or no longer pending, is left alone. True if a pending job was
        there; always False without the capability."""
        ...

    def release(self, job_id: int, owner: str | None = None) -> bool:
        """Undo ``hold``: the backend's queue may start the job again. Idempotent, as hold."""
        ...

    def is_held(self, remote: RemoteJob) -> bool:
        """Whether a job ``states`` said is ``pending`` is held in the backend's queue."""
        ...

    def states(self, expect: Expect, owner: str | None = None) -> dict[int, RemoteJob]:
        """What the node says now of each expected job (id -> ``RemoteJob``), in one round trip;
        ``expect``: (id, recorded pid, recorded start) as ``LaunchResult`` gave them, or ids'
        triples with Nones. The truth whatever was recorded: ``running`` only while the
        attempt runs, ``exited`` (with its exit code when known) once it ended, ``missing``
        only when it provably never started (the controller may then launch it again),
        ``claimed`` when a launch was interrupted and whether it started is unknown,
        ``pending`` while the backend's queue holds it (``keeps_jobs_pending``), ``unknown``
        when the node answered but could not look. The pool's poll gives the same for every
        node at once (``Pool.poll_all``); this is the one-node read (reconcile)."""
        ...

    def read_log(self, job_id: int, offset: int = 0, max_bytes: int = 65536,
                 owner: str | None = None, job: Job | None = None,
                 stream: str = "output") -> LogBytes:
        """Up to ``max_bytes`` (capped by the backend) of the job's output (``stream``
        "output") or --error file ("error") from ``offset``. A backend may need ``job`` to
        find it (InputError without). Read without blocking and only as whoever the job runs
        as, so naming a path gives its owner nothing they could not read. NotFoundError when
        there is none yet."""
        ...

    def read_progress(self, job: Job, offset: int, max_bytes: int
                      ) -> tuple[bytes, int] | None:
        """(up to ``max_bytes`` of the job's progress file from ``offset``, its size), None if
        the job wrote none. Read as ``read_log`` reads."""
        ...

    def write_input(self, job: Job, data: bytes) -> None:
        """Hand ``data`` (keystrokes) to the terminal of a running ``iadeep run --pty`` job: the
        FIFO ``TTY_INPUT`` its script made in its job directory (``interactive``), written
        without blocking, never following a link, never creating a file. More than
        ``MAX_INPUT`` bytes: InputError "at most MAX_INPUT bytes of input at once, got N",
        nothing written (the only check: the controller relies on it). NodeError if the job
        has no such terminal (not one, or it has ended); a backend without ``interactive``
        raises NodeError saying so."""
        ...

    def set_aside(self, job_id: int, suffix: str, owner: str | None = None) -> None:
        """Keep the attempt's files (renamed with ``suffix``, [A-Za-z0-9_-]+) so that the next
        attempt of the job here starts fresh. Idempotent; nothing to do without ``job_dirs``."""
        ...

    def clean(self, job_ids: Sequence[int], owner: str | None = None) -> None:
        """Remove the ended jobs' files on the node (attempts set aside included), never
        following a link a job put there. Idempotent; ids must be ints >= 0 (InputError)."""
        ...

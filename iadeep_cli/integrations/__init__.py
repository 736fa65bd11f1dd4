"""Hooks for training jobs: report progress to iadeep, checkpoint on its signal, resume.

A job on a node imports one of these; iadeep itself never does. This module is stdlib only (as
``progress``): the framework's own module (``integrations.torch``, ``.lightning``,
``.transformers``, ``.keras``) imports its framework, which the job brings; iadeep declares
none of them. docs/submitting.md "Training frameworks" shows each in a few lines.

What every hook does:

- reports the steps done (``<time> <step>`` lines) and the steps in all (``total N``) to
  ``$IADEEP_PROGRESS_FILE`` (progress.py), so the controller measures the job's speed;
- on the job's checkpoint signal (``--checkpoint-signal``, USR1 for a ``--requeue`` job; iadeep
  says which in ``$IADEEP_CHECKPOINT_SIGNAL``) only sets a flag: the handler runs between two
  bytecodes, maybe inside the optimiser's step, where saving would write half-updated weights;
- at the next safe point (the end of a training step) saves a checkpoint and exits with
  ``REQUEUE_EXIT_CODE``; iadeep requeues a job that exits after it sent the signal, whatever
  the code, and 75 (``EX_TEMPFAIL``) tells anyone else "not done, run me again";
- on the next start finds the checkpoint and resumes from it (``IADEEP_RESTART_COUNT`` > 0).

The checkpoint must be written to the job's working directory (``--chdir``, or a directory
the nodes share): the job directory is set aside when an attempt ends.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from ..progress import report, report_total

REQUEUE_EXIT_CODE = 75        # sysexits.h EX_TEMPFAIL: "try again later"
SIGNAL_ENV = "IADEEP_CHECKPOINT_SIGNAL"
RESTART_ENV = "IADEEP_RESTART_COUNT"
DEFAULT_SIGNAL = "USR1"


def checkpoint_signal(name: str | None = None) -> signal.Signals:
    """The signal to checkpoint on: ``name`` ("USR1", "SIGUSR2", "10"), else
    $IADEEP_CHECKPOINT_SIGNAL, else USR1."""
    text = (name or os.environ.get(SIGNAL_ENV) or DEFAULT_SIGNAL).strip().upper()
    if text.isdigit():
        return signal.Signals(int(text))
    return signal.Signals[text if text.startswith("SIG") else "SIG" + text]


def restart_count() -> int:
    """How many times this job started before (0 on its first attempt, or outside iadeep)."""
    try:
        return max(0, int(os.environ.get(RESTART_ENV, "0")))
    except ValueError:
        return 0


class Requeue:
    """The part every hook shares: a flag the signal sets, and progress lines.

    ``requested`` turns true when the checkpoint signal arrives (the handler does nothing
    else); the hook checks it at the end of each step. ``step_done(step)`` reports progress
    (at most every ``every_s`` seconds, and always the first and the last before an exit)."""

    def __init__(self, signal_name: str | None = None, *, every_s: float = 1.0,
                 progress_file: str | None = None) -> None:
        self.signum = checkpoint_signal(signal_name)
        self.every_s = every_s
        self.progress_file = progress_file
        self._requested = threading.Event()
        self._last_report = float("-inf")
        self._total: int | None = None
        self.install()

    # -- the signal
    def install(self) -> None:
        """Install the handler (again: a framework may have replaced it). From the main
        thread only, as Python allows; elsewhere nothing is installed."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(self.signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._requested.set()   # only this: the next safe point saves (see the module's doc)

    @property
    def requested(self) -> bool:
        """The checkpoint signal arrived: save at the next safe point and exit."""
        return self._requested.is_set()

    def request(self) -> None:
        """Ask for a checkpoint and exit from code (as the signal does)."""
        self._requested.set()

    # -- progress
    def total(self, steps: int | float | None) -> None:
        """Report the steps in all once known (ignored when unknown or infinite)."""
        if steps is None or steps != steps or steps in (float("inf"), float("-inf")):
            return
        if int(steps) > 0 and int(steps) != self._total:
            self._total = int(steps)
            report_total(self._total, self.progress_file)

    def step_done(self, step: int, *, force: bool = False) -> None:
        """Report ``step`` steps done (throttled to one line every ``every_s`` seconds)."""
        now = time.monotonic()
        if force or self.requested or now - self._last_report >= self.every_s:
            self._last_report = now
            report(step, self.progress_file)

    def exit(self) -> None:
        """Leave the process with REQUEUE_EXIT_CODE (SystemExit: ``finally`` blocks run)."""
        raise SystemExit(REQUEUE_EXIT_CODE)


def atomic_path(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """(the file, a temporary name beside it): write the temporary, then ``os.replace``, so a
    job stopped while saving never leaves a half-written checkpoint under the real name."""
    final = Path(path)
    return final, final.with_name(f".{final.name}.{os.getpid()}.tmp")

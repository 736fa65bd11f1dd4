"""Stopping what a test's jobs left running without ever signalling a stranger.

A job's pid file says ``PID STARTTIME`` (the launcher's, see nodes/shell/backend.py).  The
machine's pids wrap (``pid_max`` is 32768 here) while a whole suite starts thousands of
processes, so a job that ended a while ago has its pid reused soon, often by another test's
session leader such as a node's sshd connection: a ``killpg`` on the bare pid once cut another
test's SSH connection in the middle of its reads.  A pid is believed only while the process
with it started at the recorded time (or, with no time recorded, carries the job's own
progress file in its environment), as the product itself checks (``IS_OURS``)."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path


def recorded_leader(pid_file: Path) -> int | None:
    """The job's session leader named by ``pid_file`` if it still runs, else None."""
    try:
        fields = pid_file.read_text().split()
        pid = int(fields[0])
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError, IndexError):
        return None
    after = stat.rsplit(") ", 1)[1].split()
    if len(fields) > 1:
        return pid if after[19] == fields[1] else None
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    mine = f"IADEEP_PROGRESS_FILE={pid_file.parent}/progress".encode()
    return pid if mine in environ else None


def kill_recorded_jobs(pid_files: Iterable[Path]) -> list[int]:
    """SIGKILL the process group of every job whose pid file names a leader still running;
    the pids signalled."""
    killed = []
    for pid_file in pid_files:
        pid = recorded_leader(pid_file)
        if pid is None:
            continue
        try:
            os.killpg(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed

"""`iadeep run --pty`: the client's half of an interactive job (requests/interactive.py has
the design).

``pty_script`` is the job: it makes the FIFO its keystrokes arrive in and runs the command on
a pseudo-terminal of its own (util-linux ``script``, which every Linux distribution ships), so
a shell prompts, echoes and edits lines as it would over ssh. Everything the terminal shows is
the job's log, which `iadeep run` prints as it comes. Once the job runs, ``Keys`` puts this
terminal in raw mode (each key goes at once; Ctrl-C, Ctrl-D, Tab reach the remote command, not
this client; closing the terminal still cancels the job: SIGHUP) and sends what is typed to the
controller, one request per read, from a thread of its own. While the job waits in the queue
the terminal is as usual, so Ctrl-C there cancels it as `iadeep run` always does.

The terminal's size is given to the remote one when the job starts; a later resize is not
passed on (`stty rows R cols C` in the session fixes it by hand).
"""
from __future__ import annotations

import base64
import os
import re
import shlex
import sys
import threading

from ..errors import IadeepError
from ..jobs import MAX_INPUT, TTY_INPUT
from .lazy import client, messages as m

_TERM = re.compile(r"^[A-Za-z0-9.+_-]{1,64}$")


def pty_script(command: list[str], rows: int, cols: int, term: str) -> bytes:
    """The job script of `iadeep run --pty COMMAND`: the FIFO, then COMMAND on a terminal of
    ``rows`` x ``cols`` fed from it (``script -e``: the job's exit status is COMMAND's)."""
    inner = (f"stty rows {int(rows)} cols {int(cols)} 2>/dev/null; SHELL=$IADEEP_SHELL; "
             f"unset IADEEP_SHELL; exec {shlex.join(command)}")
    term = term if _TERM.match(term) else "xterm"
    return (
        "#!/bin/sh\n"
        "# iadeep run --pty: the command on a terminal of its own; its keystrokes arrive in\n"
        "# the FIFO below (written by the controller, for this job's owner only)\n"
        f'f="${{IADEEP_PROGRESS_FILE%/*}}/{TTY_INPUT}"\n'
        'rm -f "$f" && mkfifo -m 600 "$f" || exit 125\n'
        'exec 3<>"$f"\n'   # read-write: opening never blocks, and no EOF while it runs
        f"TERM={shlex.quote(term)}; export TERM\n"
        # script runs the command with $SHELL -c: sh, whatever the account's login shell is
        # (nologin for a service account); the command gets $SHELL back
        'IADEEP_SHELL=${SHELL:-/bin/sh}; SHELL=/bin/sh; export IADEEP_SHELL SHELL\n'
        f"exec script -qefc {shlex.quote(inner)} /dev/null <&3\n"
    ).encode()


def terminal_size() -> tuple[int, int]:
    """(rows, columns) of the terminal on stdout, or 24 x 80."""
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
        return size.lines, size.columns
    except (OSError, ValueError):
        return 24, 80


def _raw(fd: int) -> list | None:
    """Put the terminal ``fd`` in raw mode for input (each key at once; Ctrl-C, Ctrl-Z, Ctrl-\\
    are bytes for the remote command, not signals here), keeping output as it was; the mode
    to restore, or None if ``fd`` is not a terminal."""
    if not os.isatty(fd):
        return None
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSANOW)   # (not TCSAFLUSH: what was typed ahead is kept, and sent)
    mode = termios.tcgetattr(fd)
    mode[1] = saved[1]   # output processing unchanged: this client's own lines stay lines
    termios.tcsetattr(fd, termios.TCSANOW, mode)
    return saved


class Keys:
    """What is typed on stdin, sent to job ``job_id``'s terminal from a daemon thread, from
    ``start`` until stdin ends or the controller refuses (the job ended)."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()
        self._error: str | None = None   # why keys stopped being sent (see take_error)
        self._error_lock = threading.Lock()
        self._saved: list | None = None   # the terminal's mode before raw mode

    def start(self) -> None:
        """Once the job runs: this terminal raw, and what is typed sent from then on."""
        if self.thread is None:
            self._saved = _raw(sys.stdin.fileno())
            self.thread = threading.Thread(target=self._pump, name="iadeep-keys", daemon=True)
            self.thread.start()

    def take_error(self) -> str | None:
        """Why what is typed no longer reaches the job, the first time it is asked after the
        sending stopped on an error; None before that and every time after."""
        with self._error_lock:
            error, self._error = self._error, None
        return error

    def close(self) -> None:
        """This terminal as it was (whatever happened meanwhile)."""
        self.stopped.set()
        if self._saved is not None:
            import termios

            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self._saved)
            self._saved = None

    def _pump(self) -> None:
        fd = sys.stdin.fileno()
        while not self.stopped.is_set():
            try:
                data = os.read(fd, MAX_INPUT)
            except OSError:
                return
            if not data:   # stdin ended (not a terminal): the command gets no more input
                return
            try:
                client.ask(m.InputRequest(self.job_id, base64.b64encode(data).decode()))
            except IadeepError as exc:   # it ended meanwhile (the main loop says so)
                self._stop(exc.message)
                return
            except Exception as exc:   # e.g. a reply this client cannot read: said too
                self._stop(f"{type(exc).__name__}: {exc}")
                return

    def _stop(self, error: str) -> None:
        with self._error_lock:
            self._error = error

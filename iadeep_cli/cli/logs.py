"""`iadeep logs ID`: a job's output, fetched by the controller from its node.

The end of a log is where the error is, so by default it prints the last 100 lines (within
the last 64 KiB) and says on stderr when earlier output was left out; ``--head N`` / ``--tail N``
choose lines, ``--all`` prints everything, ``--follow`` then keeps printing what the job writes.
Every request reads at most ``CHUNK`` bytes (the controller's own cap), so a log of any size
streams in bounded memory. What a job wrote is its own text, and admins read others' logs: it is
printed through ``checks.TerminalFilter`` (colours, tabs, carriage returns and backspaces stay;
every other escape sequence or control character is shown escaped, ``\\x1b``), on a terminal
as into a pipe; ``--raw`` prints the bytes as the job wrote them.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

import typer

from ..checks import TerminalFilter
from ..errors import InputError, NodeError
from . import complete
from .lazy import client, messages as m
from .root import app

CHUNK = 1 << 20                      # bytes per request
DEFAULT_LINES, DEFAULT_BYTES = 100, 64 * 1024
NODE_PATIENCE_S = 300.0              # --follow waits this long for a node that stopped answering


class _Log:
    """One job's log, read through the controller; remembers its size and whether it ended."""

    def __init__(self, job_id: int, stream: str = "output", raw: bool = True):
        self.job_id, self.size, self.finished = job_id, 0, False
        self.offset = 0              # where ``drain`` goes on from
        self.stream = stream
        self.state: m.JobState | None = None
        self.filter = None if raw else TerminalFilter()

    def shown(self, text: str) -> str:
        """``text`` as printed: as it is (raw), else through the terminal filter."""
        return text if self.filter is None else self.filter.feed(text)

    def end(self) -> str:
        """What the filter held back at the end of what was printed (an unfinished SGR)."""
        return "" if self.filter is None else self.filter.end()

    def read(self, offset: int, max_bytes: int) -> m.LogChunk:
        reply = client.ask(m.LogsRequest(self.job_id, offset, max_bytes, self.stream))
        self.size = max(self.size, reply.size or reply.offset)
        self.finished, self.state = reply.finished, reply.state
        return reply


def _cut(text: str, lines: int) -> tuple[int, int]:
    """Where in ``text`` its first ``lines`` newlines end, and how many of them were missing."""
    pos = 0
    while lines and (nl := text.find("\n", pos)) >= 0:
        pos, lines = nl + 1, lines - 1
    return pos, lines


def _copy(log: _Log, start: int, end: int, skip: int = 0, keep: int | None = None) -> int:
    """Print bytes [start, end) of the log, leaving out its first ``skip`` lines and stopping
    after ``keep`` lines (None: all); returns the offset reached."""
    offset = start
    while offset < end and keep != 0:
        reply = log.read(offset, min(CHUNK, end - offset))
        if reply.offset <= offset:
            break                    # the log shrank (rewritten by the job)
        offset, text = reply.offset, reply.data
        if skip:
            pos, skip = _cut(text, skip)
            text = "" if skip else text[pos:]
        if keep is not None:
            pos, left = _cut(text, keep)
            text, keep = (text, left) if left else (text[:pos], 0)
        sys.stdout.write(log.shown(text))
        sys.stdout.flush()
    return offset


def _tail_start(log: _Log, end: int, lines: int, max_back: int | None) -> tuple[int, int]:
    """Where the last ``lines`` lines of the log's first ``end`` bytes begin: (the offset to
    print from, how many lines to leave out there).  Counts newlines one chunk at a time
    backwards, at most ``max_back`` bytes; a line cut by that limit is left out unless it is
    the only one (a log that is one long line still shows its end)."""
    start, newlines, last = end, 0, ""
    limit = end if max_back is None else min(end, max_back)
    while end - start < limit:
        step = min(CHUNK, limit - (end - start))
        text = log.read(start - step, step).data
        last = last or text[-1:]
        newlines, start = newlines + text.count("\n"), start - step
        if newlines + (last != "\n") > lines:
            break
    total = newlines + (last not in ("", "\n"))      # lines in [start, end)
    skip = max(0, total - lines)
    return start, skip or int(start > 0 and total > 1)


def _follow(log: _Log, offset: int) -> None:
    """Print what the job writes from ``offset`` on, until it has ended and nothing is left.
    A node that does not answer for a moment (a dropped connection, an overloaded node) is
    said once and waited out, for up to ``NODE_PATIENCE_S``: the job goes on meanwhile."""
    log.offset = offset
    failing_since: float | None = None
    while True:
        try:
            got = drain(log)
        except NodeError as exc:
            now = time.monotonic()
            if failing_since is None:
                failing_since = now
                print(f"note: {exc.message}; still following job {log.job_id}",
                      file=sys.stderr)
            elif now - failing_since > NODE_PATIENCE_S:
                raise
            time.sleep(1.0)
            continue
        failing_since = None
        if log.finished and not got:
            return
        if not got:
            time.sleep(1.0)


def drain(log: _Log, out: TextIO | None = None) -> bool:
    """Print (to ``out``, default stdout) what the log holds from ``log.offset`` now, a chunk
    at a time, moving ``log.offset`` past each chunk printed (so a read that fails half way
    is resumed where it stopped); whether there was any. ``iadeep run`` streams with it too."""
    got = False
    while True:
        reply = log.read(log.offset, CHUNK)
        if not reply.data:
            log.offset = reply.offset
            return got
        stream = out or sys.stdout
        stream.write(log.shown(reply.data))
        stream.flush()
        log.offset, got = reply.offset, True


def _check(head: int | None, tail: int | None, all_: bool, follow: bool) -> None:
    chosen = [n for n, on in (("--head", head is not None), ("--tail", tail is not None),
                              ("--all", all_)) if on]
    if len(chosen) > 1 or (head is not None and follow):
        both = " and ".join(chosen[:2]) if len(chosen) > 1 else "--head and --follow"
        raise InputError(f"{both} cannot be combined",
                         hint="choose one of --head N, --tail N and --all (--follow goes with "
                              "--tail or --all)")
    for name, n in (("--head", head), ("--tail", tail)):
        if n is not None and n < 0:
            raise InputError(f"{name} needs a number of lines >= 0, got {n}",
                             hint=f"e.g. {name} 50")


def _first_read(log: _Log, follow: bool) -> None:
    """The log's first byte (its size and the job's state). A job on a node that does not
    answer: said (the controller says what happens to the job meanwhile); with --follow, said
    once and waited out for up to ``NODE_PATIENCE_S``, as ``iadeep run`` waits."""
    since: float | None = None
    while True:
        try:
            log.read(0, 1)
            if since is not None:
                print(f"note: job {log.job_id}'s node answers again", file=sys.stderr)
            return
        except NodeError as exc:
            if not follow:
                raise
            now = time.monotonic()
            if since is None:
                since = now
                print(f"note: {exc.message}; waiting for the node (up to "
                      f"{NODE_PATIENCE_S / 60:.0f} min)", file=sys.stderr)
            elif now - since > NODE_PATIENCE_S:
                raise
            time.sleep(1.0)


def _not_started(log: _Log, follow: bool) -> None:
    """A job still waiting has no log yet: say so, rather than print nothing."""
    if log.size or log.state not in (m.JobState.QUEUED, m.JobState.HELD):
        return
    what = f"job {log.job_id} has not started yet ({log.state.value}): it has no log"
    if follow:
        print(f"note: {what}; waiting for it to start", file=sys.stderr)
        return
    raise InputError(what, hint=f"`iadeep queue why {log.job_id}` says what it waits for; "
                                f"`iadeep logs {log.job_id} --follow` waits for its output")


@app.command("logs")
def logs(job_id: int = typer.Argument(..., help="Job id.", autocompletion=complete.job_ids),
         follow: bool = typer.Option(False, "--follow", "-f",
                                     help="Keep printing new output until the job ends."),
         head: int | None = typer.Option(None, "--head", metavar="N",
                                         help="Print the first N lines."),
         tail: int | None = typer.Option(None, "--tail", metavar="N",
                                         help="Print the last N lines (default: the last "
                                              f"{DEFAULT_LINES}, within its last "
                                              f"{DEFAULT_BYTES // 1024} KiB)."),
         all_: bool = typer.Option(False, "--all", help="Print the whole log."),
         stderr: bool = typer.Option(False, "--stderr",
                                     help="Read its --error file instead (a job without "
                                          "--error has its stderr with its stdout)."),
         raw: bool = typer.Option(False, "--raw",
                                  help="Print the bytes as the job wrote them (by default "
                                       "escape sequences other than colours, and control "
                                       "characters other than tab, newline, carriage return "
                                       "and backspace, are shown escaped, e.g. \\x1b).")
         ) -> None:
    """Print a job's stdout and stderr (its --output file, if it gave one; --stderr: its
    --error file): by default its end (the CLI never opens SSH itself; the controller does)."""
    _check(head, tail, all_, follow)
    log = _Log(job_id, "error" if stderr else "output", raw=raw)
    _first_read(log, follow)         # learns the size and the job's state
    _not_started(log, follow)
    end, skip, keep = log.size, 0, head
    if head is not None or all_:
        start = 0
    else:
        lines = DEFAULT_LINES if tail is None else tail
        start, skip = _tail_start(log, end, lines, DEFAULT_BYTES if tail is None else None)
        if tail is None and (start or skip):
            print(f"note: showing the last lines of job {job_id}'s log ({end:,} bytes); earlier "
                  f"output omitted (all of it: iadeep logs {job_id} --all; more: --tail N)",
                  file=sys.stderr)
    offset = _copy(log, start, end, skip, keep)
    if follow:
        _follow(log, offset)
    sys.stdout.write(log.end())

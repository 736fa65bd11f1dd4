"""`iadeep run [OPTIONS] -- COMMAND ...`: submit a command and wait for it, as ``srun`` does.

The command becomes a job like any other (a two-line sh script that execs it, its words quoted
exactly), submitted with `queue add`'s options and code (``queue.submission``). While it waits
the client shows its place and the scheduler's reason on stderr (one line rewritten in place on
a terminal, a line per change otherwise); once it runs, the client prints its log as
`iadeep logs --follow` does (``logs.drain``), and exits with the job's exit code.

The job's stdout and stderr are one log (``2>&1`` on its node), which goes to stdout here; with
``--error FILE`` its stderr has a file of its own, printed to stderr here.

SIGINT, SIGHUP and SIGTERM cancel the job through the controller's ``cancel`` (as
`iadeep queue cancel`) and wait until it has ended; ``--detach`` leaves it queued or running
instead, as a batch job. The handlers only set a flag, so a signal never cuts a request in half
(a submission is sent whole, then the flag is read). A controller that stops answering while
the client waits (restarted, killed) is said in one line and retried for ``RECONNECT_S``; the
job is the controller's, so it neither ends nor runs twice because the client lost sight of it.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import typer

from ..errors import ControllerUnavailable, InputError
from ..jobs import FINISHED, JobState
from ..scheduler import priority
from ..text import forecast_text
from . import queue, runpty
from .lazy import client, messages as m
from .logs import _Log, drain
from .root import app

RUN_PATH = "run.sh"          # the job script's name (as --wrap's wrap.sh: a name, never written)
RECONNECT_S = 300.0          # how long a controller that stopped answering is waited for
POLL_S = 1.0                 # between looks at a waiting job or a quiet log
PTY_POLL_S = 0.1             # ... at a quiet terminal (`--pty`): what is typed echoes soon
WAITING = (JobState.QUEUED, JobState.HELD)
# The exit status when the client cancelled the job on a signal (128 + its number, as a shell).
SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)


def command_script(command: list[str]) -> bytes:
    """The job script that runs ``command`` exactly: each word quoted for sh, then exec'd (so
    the job's exit status is the command's)."""
    return f"#!/bin/sh\nexec {shlex.join(command)}\n".encode()


@dataclass
class _Interrupts:
    """Signals the client got, by a handler that only records them."""

    got: list[int] = field(default_factory=list)

    def handler(self, signum: int, _frame: Any) -> None:
        self.got.append(signum)

    def install(self) -> None:
        for sig in SIGNALS:
            signal.signal(sig, self.handler)


class _Status:
    """The waiting line on stderr: rewritten in place on a terminal, else a line per change."""

    def __init__(self) -> None:
        self.tty = _isatty(sys.stderr)
        self.last = ""

    def show(self, text: str) -> None:
        if text == self.last:
            return
        self.last = text
        _say(f"\r\033[K{text}" if self.tty else text, end="" if self.tty else "\n")

    def done(self) -> None:
        if self.tty and self.last:
            _say("\r\033[K", end="")
        self.last = ""


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (ValueError, OSError):
        return False


def _say(text: str, end: str = "\n") -> None:
    """A line of the client's own on stderr; a terminal closed under it (SIGHUP) is no error."""
    try:
        sys.stderr.write(text + end)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _Waiter:
    """Asks the controller, riding out an outage: a request it cannot answer is said once and
    retried every POLL_S until it answers again (said too) or ``RECONNECT_S`` have passed."""

    def __init__(self, job_id: int, status: _Status, interrupts: _Interrupts):
        self.job_id, self.status, self.interrupts = job_id, status, interrupts
        self.down_since: float | None = None

    def ask(self, fn: Any, *args: Any) -> Any:
        while True:
            try:
                result = fn(*args)
            except ControllerUnavailable as exc:
                now = time.monotonic()
                if self.down_since is None:
                    self.down_since = now
                    self.status.done()
                    _say(f"iadeep run: the controller is not answering ({exc.message}); job "
                         f"{self.job_id} is kept by it: reconnecting (for up to "
                         f"{RECONNECT_S:.0f} s)")
                elif now - self.down_since > RECONNECT_S:
                    raise ControllerUnavailable(
                        f"the controller has not answered for {RECONNECT_S:.0f} s; job "
                        f"{self.job_id} is still in its queue (or running)",
                        hint=f"once it is back: `iadeep queue show {self.job_id}`, "
                             f"`iadeep logs {self.job_id} --follow`") from None
                time.sleep(POLL_S)
                continue
            if self.down_since is not None:
                self.down_since = None
                _say(f"iadeep run: the controller answers again; following job {self.job_id}")
            return result


def _position(jobs: list[m.JobView], job: m.JobView, now: float) -> tuple[int, int]:
    """(its place, of how many) among the waiting jobs in the placer's order
    (``scheduler.priority.queue_key``: priority and aging at the lab's default rate; the
    fair-share points, which `queue why` shows, are the controller's); (0, 0) if it is not
    among them (it moved since)."""
    per_hour = priority.recorded_aging(None)
    waiting = sorted((j for j in jobs if j.state in WAITING),
                     key=lambda j: priority.queue_key(j.priority, j.owner, j.submitted_at, j.id,
                                                      now, per_hour))
    found = [i for i, j in enumerate(waiting, 1) if j.id == job.id]
    return (found[0], len(waiting)) if found else (0, 0)


def _job(job_id: int, place: bool = True) -> tuple[m.JobView, list[m.JobView]]:
    """The job as the controller has it now, and the unfinished jobs (for its place in the
    queue: only with ``place``, since the whole list costs the controller as much as its
    queue is long, and a `--pty` client asks ten times a second)."""
    if not place:
        return client.ask(m.ShowRequest(job_id)).job, []
    jobs = client.ask(m.ListRequest())
    found = [j for j in jobs if j.id == job_id]
    if found:
        return found[0], jobs
    return client.ask(m.ShowRequest(job_id)).job, jobs


def _cancel(job_id: int) -> str:
    [result] = client.ask(m.CancelRequest((job_id,)))
    if result.error is not None:
        return result.error.message
    return f"job {job_id}: {result.state}"


def wait_for(job_id: int, error_stream: bool, detach: bool,
             keys: runpty.Keys | None = None) -> int:
    """Show job ``job_id`` waiting, stream its log while it runs, and return the exit status
    to leave with (see the module's docstring). ``keys``: an interactive job's (``--pty``),
    started once it runs."""
    interrupts = _Interrupts()
    interrupts.install()
    status = _Status()
    waiter = _Waiter(job_id, status, interrupts)
    logs = [(_Log(job_id, "output"), sys.stdout)]
    if error_stream:
        logs.append((_Log(job_id, "error"), sys.stderr))
    cancelled_on: int | None = None
    attempt = 0                  # the job's attempt whose log is being printed
    waiting = True               # as last seen: its place in the queue is asked for only then
    while True:
        if interrupts.got and cancelled_on is None:
            sig = interrupts.got[0]
            status.done()
            if detach:
                _say(f"iadeep run: job {job_id} keeps going as a batch job (--detach): "
                     f"`iadeep logs {job_id} --follow`, `iadeep queue cancel {job_id}`")
                return 0
            cancelled_on = sig
            _say(f"iadeep run: {signal.Signals(sig).name}: cancelling job {job_id}")
            _say(f"iadeep run: {waiter.ask(_cancel, job_id)}; waiting for it to end")
        elif len(interrupts.got) > 1 and cancelled_on is not None:
            status.done()
            _say(f"iadeep run: left job {job_id} while it is cancelled (`iadeep queue show "
                 f"{job_id}`)")
            return 128 + cancelled_on
        job, jobs = waiter.ask(_job, job_id, waiting)
        waiting = job.state in WAITING
        if job.state in WAITING or job.state == JobState.LOST:
            place, of = _position(jobs, job, time.time()) if job.state in WAITING \
                else (0, 0)
            where = f"#{place} of {of} waiting: " if place else ""
            ahead = ""   # the controller's forecast, where it has one
            if job.expected_start is not None:
                ahead = "; " + forecast_text(job.expected_start, job.expected_start_low,
                                             job.expected_start_high, job.expected_end,
                                             time.time())
            status.show(f"job {job_id} {job.state}: {where}"
                        f"{job.reason or 'not looked at yet'}{ahead}")
            time.sleep(POLL_S)
            continue
        status.done()
        if job.attempts != attempt:   # run again (its node was lost): a new log, from 0
            if attempt:
                _say(f"iadeep run: job {job_id} started again (attempt {job.attempts}); its "
                     "output from the start")
            attempt = job.attempts
            for log, _ in logs:
                log.offset = 0
        got = False
        if keys is not None and job.state == JobState.RUNNING:
            keys.start()
            error = keys.take_error()
            if error is not None:   # said once: what is typed no longer reaches it
                _say(f"\r\niadeep run: input not sent: {error}")
        if job.state != JobState.STARTING:
            for log, out in logs:
                got = waiter.ask(_drain_quietly, log, out) or got
        if job.state in FINISHED and not got:
            return _finish(job, cancelled_on)
        if not got:
            time.sleep(POLL_S if keys is None else PTY_POLL_S)


def _drain_quietly(log: _Log, out: Any) -> bool:
    """``logs.drain``, where a log not written yet (the job has only just started, or ended
    before it made one) is nothing yet; a terminal closed under us is no reason to stop
    waiting for the job's end (what is left is read, and not printed)."""
    from ..errors import NodeError, NotFoundError
    try:
        return drain(log, out)
    except (NotFoundError, NodeError):   # not written yet; its node does not answer just now
        return False
    except (OSError, ValueError):   # our stdout is gone (SIGHUP)
        with open(os.devnull, "w") as nowhere:
            return drain(log, nowhere)


def _finish(job: m.JobView, cancelled_on: int | None) -> int:
    """The status to exit with for the ended ``job`` (the command's own where it has one)."""
    if cancelled_on is not None:
        _say(f"iadeep run: job {job.id} {job.state}")
        return 128 + cancelled_on
    if job.state == JobState.SUCCEEDED:
        return 0
    detail = f" (exit code {job.exit_code})" if job.exit_code is not None else ""
    reason = f": {job.reason}" if job.reason else ""
    _say(f"iadeep run: job {job.id} {job.state}{detail}{reason}")
    if job.exit_code:
        return job.exit_code
    return 1


def _run(ctx: typer.Context,
         command: list[str] = typer.Argument(..., metavar="COMMAND...",
                                             help="The command and its arguments (after `--` "
                                                  "if it has options of its own)."),
         detach: bool = typer.Option(False, "--detach",
                                     help="On Ctrl-C or a closed terminal, leave the job "
                                          "queued or running as a batch job (default: "
                                          "cancel it)."),
         pty: bool = typer.Option(False, "--pty",
                                  help="Give COMMAND a terminal of its own on the node and type "
                                       "into it from here (e.g. `iadeep run --pty bash`); "
                                       "--time defaults to the lab's interactive_time_limit."),
         **options: Any) -> None:
    """Run COMMAND as a job on GPUs and wait for it: shows its place in the queue and why it
    waits, prints its output as it comes, and exits with its exit status. Takes `iadeep queue
    add`'s options. Ctrl-C (or closing the terminal) cancels it; --detach keeps it as a batch
    job instead. With --pty, Ctrl-C goes to COMMAND, and the job ends when COMMAND exits."""
    if options.get("array") is not None:
        raise InputError("--array makes many jobs; `iadeep run` waits for one",
                         hint="submit the array with `iadeep queue add --array ...`")
    if not command:
        raise InputError("no command given", hint="e.g. iadeep run --gpus 1 -- python train.py")
    if pty and (detach or options.get("error") is not None):
        raise InputError(f"--pty cannot go with --{'detach' if detach else 'error'}",
                         hint="a terminal is typed into from here and shows stdout and stderr "
                              "together; leave that option out")
    here = queue._here()
    content = (runpty.pty_script(command, *runpty.terminal_size(),
                                 os.environ.get("TERM", "xterm"))
               if pty else command_script(command))
    path = os.path.join(here or "/", RUN_PATH)
    request = queue.submission({**options, "args": None}, content, path,
                               os.path.basename(command[0])[:64])
    if pty:
        request = dataclasses.replace(request, spec=dataclasses.replace(request.spec,
                                                                        interactive=True))
    job_id = client.submit(request, content).id
    _say(f"iadeep run: job {job_id} submitted")
    keys = runpty.Keys(job_id) if pty else None
    try:
        code = wait_for(job_id, request.spec.error is not None, detach, keys)
    finally:
        if keys is not None:
            keys.close()
    raise typer.Exit(code)


def _signature() -> inspect.Signature:
    """``_run``'s own parameters, then every option of `queue add` but its script: one
    definition of those options (typer reads a command's options from its signature)."""
    own = list(inspect.signature(_run, eval_str=True).parameters.values())[:-1]
    shared = [p for name, p in inspect.signature(queue.add, eval_str=True).parameters.items()
              if name not in queue.SCRIPT_PARAMS]
    return inspect.Signature([*own, *shared])


_SIGNATURE = _signature()
_run.__signature__ = _SIGNATURE   # type: ignore[attr-defined]
_run.__annotations__ = {p.name: p.annotation for p in _SIGNATURE.parameters.values()}
app.command("run", context_settings={"allow_interspersed_args": False})(_run)

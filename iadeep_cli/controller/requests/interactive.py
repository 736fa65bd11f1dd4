"""`iadeep run --pty`: a command with a terminal of its own on its node, typed into from the
submitter's terminal through the controller.

The job is an ordinary job (queued, placed, accounted, limited, idle-watched like any other);
what makes it interactive is its script (``cli/run.py``'s ``pty_script``): it makes a FIFO in
its job directory (``jobs.TTY_INPUT``) and runs the command under util-linux
``script``, which gives it a pseudo-terminal fed from that FIFO and writes everything the
terminal shows to the job's log. The client reads the log as `iadeep run` always does, and
sends its keystrokes here (``InputRequest``), which the job's backend writes into the FIFO as
the job's owner (``Backend.write_input``).

Rules: only the job's owner may type into it (not even an admin: keystrokes into someone's
shell act as them); only while it runs; only on a node whose backend has a terminal to give
(``Backend.interactive``); the job's --time defaults to ``lab.interactive_time_limit`` (set by
``Service``, the one place lab defaults are decided).

A shell nobody can type into any more must not hold a GPU until its time limit: the owner's
client reads the job's log several times a second while it runs, and every such read (and every
keystroke) is noted in ``Presence``; a running interactive job not heard from for
``lab.interactive_grace`` (a client killed with SIGKILL, its machine gone) is stopped like a
cancelled one (``round/steps/limits.py``); the notes are kept in ``controller/presence.py``, which
both rooms share (the service notes through its port). The count starts afresh when the
controller starts.
"""
from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence

from ... import messages as m
from ...errors import InputError, InvalidTransition, PermissionDenied
from ...jobs import Job, JobState
from ...nodes.backend import features
from ...settings import Node

# How the controller reaches a job's terminal: ``runtime`` sets it to the node pool's backend
# of the job's node (None: a controller without node connections).
InputWriter = Callable[[Job, bytes], None]


def check_nodes(candidates: Sequence[Node]) -> None:
    """Refuse an interactive job that could be placed on a node whose backend has no terminals
    (``Features.interactive``: false for a batch system's nodes)."""
    without = [n for n in candidates if not features(n.backend).interactive]
    if not without:
        return
    kind = features(without[0].backend)
    others = [n.name for n in candidates if features(n.backend).interactive]
    raise InputError(f"`iadeep run --pty` needs a node iadeep reaches over SSH; this job could "
                     f"be placed on {kind.label} node(s) "
                     f"{', '.join(n.name for n in without[:5])}",
                     hint=f"add --nodelist {','.join(others[:5])}" if others else
                     f"on a {kind.label} lab use `{kind.terminal_instead}` for an interactive "
                     "shell")


def time_limit(lab_limit: float, most: float | None) -> float:
    """An interactive job's --time when it gives none: the lab's, within its maximum."""
    return lab_limit if most is None else min(lab_limit, most)


def write(writer: InputWriter | None, job: Job, user: str, req: m.InputRequest
          ) -> m.JobActionResult:
    """``req``'s keystrokes into ``job``'s terminal (see the module's rules). Their size is
    the backend's to bound (``Backend.write_input``: InputError past ``MAX_INPUT``)."""
    if job.owner != user:
        raise PermissionDenied(f"job {job.id} belongs to {job.owner}; only its owner may type "
                               "into it", hint="an interactive job's terminal is its owner's")
    if not job.spec.interactive:
        raise InputError(f"job {job.id} is not interactive",
                         hint="start one with `iadeep run --pty COMMAND`")
    if job.state != JobState.RUNNING:
        raise InvalidTransition(f"job {job.id} is {job.state.value}, not running: nothing "
                                "reads its terminal", hint=f"`iadeep queue show {job.id}`")
    try:
        data = base64.b64decode(req.data_b64.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise InputError("input is not base64", hint="client and controller versions differ?") \
            from None
    if writer is None:
        raise InputError("this controller has no node connections",
                         hint="start it with an inventory: iadeep controller run --inventory FILE")
    if data:
        writer(job, data)
    return m.JobActionResult(job.id, job.state.value)

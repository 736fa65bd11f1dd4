"""Talking to the controller from the CLI and the TUI.

A request that never reached the controller fails at once with "controller is not running".
A request whose reply was lost (the controller died mid-request) is retried for a while with
the same ``token``, so a submission is accepted exactly once even across a controller restart.
A connection the controller refuses (too many at once, request too large) fails at once with
its one-line reason, which it sends before closing: it is read even if sending failed.
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any, TypeVar

from .. import messages as m, paths
from ..errors import ControllerUnavailable, error_from_dict
from ..jobs import SubmitSpec
from . import protocol

RETRY_WINDOW_S = 30.0
R = TypeVar("R")


def _not_running(path: Path) -> ControllerUnavailable:
    if not paths.iadeep_home_set():   # this account's own directory, not the lab's
        return ControllerUnavailable(
            f"no iadeep controller answers in your default state directory ({path.parent}); "
            "IADEEP_HOME is not set",
            hint=f"{paths.SET_IADEEP_HOME}, or start one of your own with "
                 "`iadeep controller run`")
    return ControllerUnavailable(
        f"the iadeep controller is not running (no answer on {path})",
        hint="start it with `iadeep controller run` (or `systemctl start iadeep-controller`)")


def _once(path: Path, op: str, args: dict, timeout: float) -> dict | None:
    """One round trip. Raises _NotReached if nothing was sent; None if the reply was lost."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            _connect(sock, path, timeout)
        except (TimeoutError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise _NotReached() from exc
        try:
            protocol.send(sock, {"op": op, "args": args})
        except (ConnectionResetError, BrokenPipeError):
            pass  # refused at once (too many connections, too large): the reason is waiting
        try:
            return protocol.recv(sock)  # type: ignore[return-value]
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            return None
    finally:
        sock.close()


class _NotReached(Exception):
    pass


def _connect(sock: socket.socket, path: Path, timeout: float) -> None:
    """connect(), waiting while the listen backlog is full (EAGAIN on a busy Unix socket)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.connect(str(path))
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError("controller too busy") from None
            time.sleep(0.01)


def ask(request: m.Request[R], *, timeout: float = 60.0, retry_lost: bool = False,
        socket_path: Path | None = None) -> R:
    """Send one request; return its typed reply or raise the controller's error."""
    result = call(request.op, request.to_dict(), timeout=timeout, retry_lost=retry_lost,
                  socket_path=socket_path)
    return m.decode(request.reply_type(), result)


def call(op: str, args: dict | None = None, *, timeout: float = 60.0,
         retry_lost: bool = False, socket_path: Path | None = None) -> Any:
    """Send one request as JSON (``ask`` is the typed way); return the JSON result or raise
    the controller's error."""
    path = socket_path or paths.StateDir.default().socket
    if len(os.fsencode(path)) >= 108:   # sun_path: connect() would fail with OSError
        raise ControllerUnavailable(
            f"the controller's socket path {path} is too long for a Unix socket (over 107 "
            "bytes), so no controller can listen there", hint="use a shorter state directory "
            "(IADEEP_HOME)" if paths.iadeep_home_set() else paths.SET_IADEEP_HOME)
    args = dict(args or {})
    deadline = time.monotonic() + RETRY_WINDOW_S
    reached_once = False
    while True:
        try:
            reply = _once(path, op, args, timeout)
            reached_once = True
        except _NotReached:
            if not reached_once:
                raise _not_running(path) from None
            reply = None
        if reply is not None:
            break
        if not retry_lost or time.monotonic() > deadline:
            raise ControllerUnavailable(
                f"the controller stopped while answering {op!r}",
                hint="check `iadeep queue list`; a repeated submission is not duplicated")
        time.sleep(0.2)
    if reply.get("ok"):
        return reply.get("result")
    raise error_from_dict(reply.get("error") or {})


def submit(spec: SubmitSpec, script_content: bytes) -> m.AddResult:
    """Submit a job exactly once: the token makes a retried request return the same id."""
    import base64

    request = m.AddRequest(spec, token=uuid.uuid4().hex,
                           script_b64=base64.b64encode(script_content).decode("ascii"))
    return ask(request, retry_lost=True)


def read(request: m.Request[R]) -> tuple[R, float | None]:
    """A read-only view: from the controller when it runs, else what ``offline`` can show.

    Returns (reply, stale_since): ``stale_since`` is None when the controller answered, else
    the time of its last heartbeat (0.0 if it never ran), so callers can show the data's age.
    """
    try:
        return ask(request), None
    except ControllerUnavailable as exc:
        down = exc
    from .requests import offline

    return offline.read(request, down)

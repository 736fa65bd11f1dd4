"""The socket protocol: one JSON request line, one JSON reply line, per connection.

Request: ``{"op": "add", "args": {...}}``.
Reply:   ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"type", "message", "hint"}}``.
There is deliberately no "user" field: the server reads the caller's uid from the socket.

A request comes from any local account, so the server reads it with a size cap and a deadline
and parses it strictly (no NaN or Infinity, no numbers of absurd length); a reply comes from
the controller and is read as it is.
"""
from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable

from ..errors import InputError

# The largest request is a submission: a script of up to 4 MiB (service.MAX_SCRIPT_BYTES) is
# 5.33 MiB in base64, plus its spec (arguments and environment are capped far lower).
MAX_REQUEST = 6 * 2**20
SMALL_REQUEST = 64 * 1024   # every request but a submission with its script
MAX_REPLY = 512 * 2**20   # `queue list --all` of a long-lived lab; the controller is trusted
_CHUNK = 65536
# JSON may escape half of a UTF-16 pair alone ("\ud800"): no text, and nothing that SQLite, a
# file name or a node's shell could take (it failed deep inside as a "bug" before).
_SURROGATE = re.compile("[\ud800-\udfff]")


def encode(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def send(sock: socket.socket, obj: object) -> None:
    sock.sendall(encode(obj))


def recv(sock: socket.socket) -> object | None:
    """Read one reply line; None if the peer closed the connection before a full line came."""
    line = _read_line(sock, MAX_REPLY, None, None)
    return None if line is None else json.loads(line)


def read_request(sock: socket.socket, deadline: float,
                 on_large: Callable[[], float]) -> object | None:
    """Read one request line by ``deadline`` (``time.monotonic``; TimeoutError after it).
    ``on_large()`` is called once the request grows past ``SMALL_REQUEST`` bytes, before more
    is read; it may wait for room and returns the seconds it waited, which extend the
    deadline. None if the peer closed the connection before a full line came."""
    line = _read_line(sock, MAX_REQUEST, deadline, on_large)
    if line is None:
        return None
    try:
        request = json.loads(line, parse_constant=_no_constant, parse_int=_int,
                             parse_float=_float)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"malformed request: not valid JSON ({exc})",
                         hint="send one JSON object per line, as `iadeep` does") from None
    _check_text(request, "request")
    return request


def _check_text(value: object, where: str) -> None:
    """InputError if any string in ``value`` (keys too) holds a lone surrogate."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found:
            raise InputError(f"malformed request: {where} holds {found.group()!r}, half of a "
                             "UTF-16 pair, which is not text",
                             hint="send text as UTF-8 (file names too)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, where)
            _check_text(item, f"{where}.{key}" if _SURROGATE.search(key) is None else where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_text(item, f"{where}[{i}]")


def parse_request(request: object) -> tuple[str, dict]:
    """``(op, args)`` of a decoded request, or an InputError saying what is malformed."""
    if not isinstance(request, dict) or not isinstance(request.get("op"), str):
        raise InputError('malformed request: expected {"op": NAME, "args": {...}}',
                         hint="send requests the way `iadeep` does")
    extra = sorted(set(request) - {"op", "args"})
    if extra:
        raise InputError(f"malformed request: unknown field {extra[0]!r}",
                         hint="identity comes from the socket; a request names only op and args")
    args = request.get("args", {})
    if not isinstance(args, dict):
        raise InputError("malformed request: args must be an object",
                         hint="send requests the way `iadeep` does")
    return request["op"], args


def _read_line(sock: socket.socket, limit: int, deadline: float | None,
               on_large: Callable[[], float] | None) -> bytearray | None:
    buf = bytearray()
    room = SMALL_REQUEST if on_large is not None else limit + 1
    while True:
        if len(buf) >= room and on_large is not None:
            deadline += on_large()   # type: ignore[operator]  # server reads have a deadline
            on_large, room = None, limit + 1
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete request in time")
            sock.settimeout(left)
        chunk = sock.recv(min(_CHUNK, room - len(buf)))
        if not chunk:
            return None
        buf += chunk
        end = buf.find(b"\n", len(buf) - len(chunk))
        if end >= 0:
            del buf[end:]
            return buf
        if len(buf) > limit:
            raise InputError(f"request larger than {limit / 2**20:g} MiB refused",
                             hint="a job script may be at most 4 MiB; submit a small launcher "
                                  "script that starts your program")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number iadeep accepts")


def _int(digits: str) -> int:
    if len(digits) > 20:   # beyond 64 bits; also keeps int() from quadratic work on huge input
        raise ValueError(f"integer of {len(digits)} digits")
    return int(digits)


def _float(literal: str) -> float:
    if len(literal) > 40:
        raise ValueError(f"number of {len(literal)} characters")
    return float(literal)   # may be inf (1e999): the fields' checks refuse non-finite values

"""The socket protocol: one JSON request line, one JSON reply line, per connection.

Request: ``{"op": "add", "args": {...}}``.
Reply:   ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"type", "message", "hint"}}``.
There is deliberately no "user" field: the server reads the caller's uid from the socket.
"""
from __future__ import annotations

import json
import socket

MAX_LINE = 16 * 1024 * 1024


def send(sock: socket.socket, obj: object) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def recv(sock: socket.socket) -> object | None:
    """Read one line; None if the peer closed the connection before a full line arrived."""
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > MAX_LINE:
            raise ValueError("message too long")
    return json.loads(buf)

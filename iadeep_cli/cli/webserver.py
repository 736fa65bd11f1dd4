"""The server behind `iadeep web`: the standard library's threading HTTP server.

Two addresses: ``/`` (one static page) and ``/api/view`` (the monitor's view as JSON, which
the page asks for every few seconds). Only GET and HEAD are answered; nothing can be changed
through it. The data is read as `iadeep monitor` reads it (the controller, or its database
when it is down), at most once per ``CACHE_S`` however many browsers ask.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..errors import IadeepError
from ..tui import source
from . import webview

CACHE_S = 1.0


class Snapshots:
    """The newest view, read again when older than ``CACHE_S`` (one reader at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = -CACHE_S
        self._body: bytes = b""
        self._status = 200

    def get(self) -> tuple[int, bytes]:
        with self._lock:
            if time.monotonic() - self._at >= CACHE_S:
                self._status, self._body = self._read()
                self._at = time.monotonic()
            return self._status, self._body

    @staticmethod
    def _read() -> tuple[int, bytes]:
        try:
            data: dict[str, Any] = webview.snapshot(source.fetch(), time.time())
            status = 200
        except IadeepError as exc:
            hint = f" (hint: {exc.hint})" if exc.hint else ""
            data, status = {"error": exc.message + hint}, 503
        return status, json.dumps(data, allow_nan=False).encode()


class Handler(BaseHTTPRequestHandler):
    server_version = "iadeep-web"
    snapshots: Snapshots

    def _send(self, status: int, body: bytes, kind: str, csp: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        if csp:
            self.send_header("Content-Security-Policy", csp)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, webview.PAGE.encode(), "text/html; charset=utf-8", webview.CSP)
        elif path == "/api/view":
            status, body = self.snapshots.get()
            self._send(status, body, "application/json")
        else:
            self._send(404, b'{"error": "not found"}', "application/json")

    do_HEAD = do_GET

    def _refuse(self) -> None:
        self._send(405, b'{"error": "read-only: only GET"}', "application/json")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def log_message(self, format: str, *args: Any) -> None:
        pass    # no access log on the terminal: the page asks every few seconds


def serve(host: str, port: int) -> ThreadingHTTPServer:
    """A server on ``host:port`` (not yet serving); IadeepError when it cannot listen there."""
    handler = type("WebHandler", (Handler,), {"snapshots": Snapshots()})
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("WebServer", (ThreadingHTTPServer,), {"address_family": family})
    try:
        server = server_class((host, port), handler)
    except OSError as exc:
        raise IadeepError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                          hint="choose another --listen HOST:PORT (port 0: any free port)"
                          ) from None
    server.daemon_threads = True
    return server

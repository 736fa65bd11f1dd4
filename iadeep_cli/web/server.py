"""The server behind `iadeep web`: the standard library's threading HTTP server.

Two addresses: ``/`` (one static page) and ``/api/view`` (the monitor's view as JSON, which
the page asks for every few seconds). Only GET and HEAD are answered; nothing can be changed
through it. The data is read as `iadeep monitor` reads it (the controller, or its database
when it is down) at most once per the controller's poll interval (``view.MIN_REFRESH_S`` to
``MAX_REFRESH_S``: nothing it shows changes faster) however many browsers ask: each read is a
status and a list of every unfinished job, which a 10,000-task array makes a real cost to the
controller.

Anyone who can reach the port may connect, so no client can stop it answering the others: at
most ``MAX_CONNECTIONS`` are served at once, each within ``TIMEOUT_S`` per read or write, and
when that many are open the oldest still sending its request (a slow client's, as slowloris
sends) is closed for the new one; a client's error is never a traceback. Only requests whose
``Host`` is an IP address, ``localhost`` or a name given with ``--host-name`` are answered
(421 otherwise): a web page elsewhere cannot read ``/api/view`` through DNS rebinding (its
name made to point at 127.0.0.1 or at an SSH tunnel's end).
"""
from __future__ import annotations

import ipaddress
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..errors import IadeepError
from ..tui import source
from . import view

CACHE_S = 1.0             # an answer that is an error is read again after this
MAX_CONNECTIONS = 64      # served at once (a thread each)
TIMEOUT_S = 10.0          # per read and per answer written
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    """Whether a request's ``Host`` header (``name[:port]``, ``[v6]:port``) names this server:
    an IP address (DNS rebinding needs a name), a loopback name, or one of ``names``."""
    if not header:
        return False
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    host = host.rstrip(".")
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return host in LOOPBACK_NAMES or host in names


class Snapshots:
    """The newest view, read again once it is as old as the page's refresh interval (the
    controller's poll interval, within 2-10 s; an error after ``CACHE_S``), one reader at a
    time: however many clients ask, the controller is asked once per interval."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._until = -1.0
        self._body: bytes = b""
        self._status = 200

    def get(self) -> tuple[int, bytes]:
        with self._lock:
            if self._clock() >= self._until:
                self._status, self._body, keep_s = self._read()
                self._until = self._clock() + keep_s
            return self._status, self._body

    @staticmethod
    def _read() -> tuple[int, bytes, float]:
        try:
            data: dict[str, Any] = view.snapshot(source.fetch(), time.time())
            status, keep_s = 200, float(data["refresh_s"])
        except IadeepError as exc:
            hint = f" (hint: {exc.hint})" if exc.hint else ""
            data, status, keep_s = {"error": exc.message + hint}, 503, CACHE_S
        return status, json.dumps(data, allow_nan=False).encode(), keep_s


class Handler(BaseHTTPRequestHandler):
    server_version = "iadeep-web"
    snapshots: Snapshots
    host_names: frozenset[str] = frozenset()
    timeout = TIMEOUT_S           # the socket's, per read and per answer (StreamRequestHandler)

    def setup(self) -> None:
        super().setup()
        self.answering = False    # True once its request has arrived whole
        if isinstance(self.server, Server):
            self.server.track(self)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.answering = True
        if ok and not host_allowed(self.headers.get("Host"), self.host_names):
            self.close_connection = True
            self._send(421, b'{"error": "unknown Host: start iadeep web with --host-name '
                            b'NAME to be reached by that name"}', "application/json")
            return False
        return ok

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
            self._send(200, view.PAGE.encode(), "text/html; charset=utf-8", view.CSP)
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


class Server(ThreadingHTTPServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` of them: when that many are open a
    new one closes the oldest still sending its request (else the oldest), so slow clients
    cannot hold every thread. Connection errors and timeouts are no tracebacks."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: dict[socket.socket, float] = {}     # connection -> when accepted
        self._handlers: dict[socket.socket, Handler] = {}
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            while len(self._open) >= MAX_CONNECTIONS:
                self._evict()
            self._open[request] = time.monotonic()
        super().process_request(request, client_address)

    def _evict(self) -> None:
        """Close the oldest connection still sending its request, else the oldest (its
        thread ends on the closed socket and forgets it; here it is forgotten at once)."""
        reading = [c for c in self._open if not getattr(self._handlers.get(c), "answering",
                                                        False)]
        oldest = min(reading or self._open, key=self._open.__getitem__)
        del self._open[oldest]
        try:
            oldest.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
            self._handlers.pop(request, None)
        super().shutdown_request(request)

    def track(self, handler: Handler) -> None:
        with self._open_lock:
            if handler.request in self._open:
                self._handlers[handler.request] = handler

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or was too slow is no error of ours: nothing is said; any
        other exception is said in one line (never a traceback per connection)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return
        print(f"iadeep web: error answering {client_address[0]}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def serve(host: str, port: int, host_names: tuple[str, ...] = (),
          snapshots: Snapshots | None = None) -> ThreadingHTTPServer:
    """A server on ``host:port`` (not yet serving), answering requests addressed to an IP
    address, localhost or one of ``host_names``; IadeepError when it cannot listen there."""
    names = frozenset(n.lower().rstrip(".") for n in host_names)
    handler = type("WebHandler", (Handler,), {"snapshots": snapshots or Snapshots(),
                                              "host_names": names})
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("WebServer", (Server,), {"address_family": family})
    try:
        server = server_class((host, port), handler)
    except OSError as exc:
        raise IadeepError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                          hint="choose another --listen HOST:PORT (port 0: any free port)"
                          ) from None
    return server

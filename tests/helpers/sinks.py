"""Real servers that notifications are sent to: an SMTP server (aiosmtpd) and an HTTP server
for webhooks, both on 127.0.0.1 in this test process, recording what they were sent."""
from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MailSink:
    """An SMTP server taking every message; ``messages`` holds them as parsed e-mails."""

    def __init__(self):
        from aiosmtpd.controller import Controller

        self.messages: list[email.message.EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.lock = threading.Lock()
        self.port = free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)

    async def handle_DATA(self, server, session, envelope):   # aiosmtpd's handler hook
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self.lock:
            self.messages.append(parsed)
            self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 OK"

    def __enter__(self) -> MailSink:
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.controller.stop()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def received(self) -> list[email.message.EmailMessage]:
        with self.lock:
            return list(self.messages)


class HookSink:
    """An HTTP server taking JSON POSTs. ``fail_first`` requests are answered 500; while
    ``hold`` is clear, requests wait for it (a hung webhook); every request is recorded.
    ``redirect_to``: every POST is answered ``302 Found`` to that URL instead; ``visits``
    records every request's method and path, GETs included (what a redirect would bring)."""

    def __init__(self, fail_first: int = 0, redirect_to: str | None = None):
        self.fail_first = fail_first
        self.redirect_to = redirect_to
        self.requests: list[dict] = []   # every POST body, answered or not
        self.accepted: list[dict] = []   # the ones answered 200
        self.visits: list[tuple[str, str]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                with sink.lock:
                    sink.visits.append(("GET", self.path))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with sink.lock:
                    sink.visits.append(("POST", self.path))
                    sink.requests.append(body)
                    failing = len(sink.requests) <= sink.fail_first
                if sink.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", sink.redirect_to)
                    self.end_headers()
                    return
                sink.hold.wait(60)
                self.send_response(500 if failing else 200)
                self.end_headers()
                self.wfile.write(b"no" if failing else b"ok")
                if not failing:
                    with sink.lock:
                        sink.accepted.append(body)

            def log_message(self, *args):   # keep the test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HookSink:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/secret-token"

    def got(self) -> tuple[list[dict], list[dict]]:
        """(every request, the accepted ones)"""
        with self.lock:
            return list(self.requests), list(self.accepted)


class DripSink:
    """A TCP server that answers every connection with ``head`` and then one more byte every
    ``every`` seconds, for ``lasts`` seconds: never a whole answer, never silent long enough
    for a read to time out (a slow-drip attack on whoever waits for its answer). ``closed``
    counts the connections the other side gave up on."""

    def __init__(self, head: bytes, every: float = 0.5, lasts: float = 600.0):
        self.head, self.every, self.lasts = head, every, lasts
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.lock = threading.Lock()
        self.connections = 0
        self.closed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        end = time.monotonic() + self.lasts
        try:
            conn.sendall(self.head)
            while time.monotonic() < end and not self.stop.is_set():
                if self.stop.wait(self.every):
                    break
                conn.sendall(b"a")
        except OSError:   # the other side closed it
            with self.lock:
                self.closed += 1
        finally:
            conn.close()

    def __enter__(self) -> DripSink:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/secret-token"

    def counts(self) -> tuple[int, int]:
        """(connections made, connections the other side closed)"""
        with self.lock:
            return self.connections, self.closed

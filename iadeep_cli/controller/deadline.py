"""Sends that end by a deadline, however their server answers.

A socket timeout bounds one read, not a send: a webhook or SMTP server that answers one byte a
second never lets a read time out, and would hold its notification channel for as long as it
keeps dripping. Here every socket a send opens is registered with a ``Deadline``; when the
deadline passes a timer shuts those sockets down, which ends the read in progress (it sees the
end of the stream, or an error) wherever in http.client or smtplib it was waiting. Each read's
own timeout is also cut to what is left, so a silent server fails at the deadline too.
"""
from __future__ import annotations

import http.client
import smtplib
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any


class DeadlineExceeded(OSError):
    """The send took longer than its deadline and was cut off."""


class Deadline:
    """Shuts down every socket registered with it once ``seconds`` have passed."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.ends = time.monotonic() + seconds
        self.expired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()

    def left(self) -> float:
        """Seconds left (a small positive floor: a socket timeout of 0 means non-blocking)."""
        return max(0.001, self.ends - time.monotonic())

    def watch(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._socks.append(sock)
            late = self.expired
        if late:
            _shut(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            socks = list(self._socks)
        for sock in socks:
            _shut(sock)

    def check(self) -> None:
        if self.expired:
            raise DeadlineExceeded(f"no complete answer within {self.seconds:g} s "
                                   "(cut off at the deadline)")


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def post_json(url: str, data: bytes, deadline: Deadline,
              headers: dict[str, str]) -> tuple[int, str]:
    """POST ``data`` to ``url`` by ``deadline``; returns the status and reason (redirects are
    answers like any other: the caller decides). Raises OSError, DeadlineExceeded included."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OSError(f"not an http(s) URL: {parts.scheme}://{parts.netloc}/...")
    cls = _HTTPS if parts.scheme == "https" else _HTTP
    conn = cls(parts.hostname, parts.port, deadline)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        conn.request("POST", path, body=data, headers=headers)
        answer = conn.getresponse()
        answer.read(65536)
        deadline.check()
        return answer.status, answer.reason
    except (OSError, http.client.HTTPException) as exc:
        deadline.check()   # a read ended by the deadline says so, not "connection reset"
        if isinstance(exc, OSError):
            raise
        raise OSError(f"a broken HTTP answer: {type(exc).__name__}") from exc
    finally:
        conn.close()


class _HTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int | None, deadline: Deadline):
        super().__init__(host, port, timeout=deadline.left())
        self.deadline = deadline

    def connect(self) -> None:
        self.timeout = self.deadline.left()
        super().connect()
        self.deadline.watch(self.sock)


class _HTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int | None, deadline: Deadline):
        super().__init__(host, port, timeout=deadline.left(),
                         context=ssl.create_default_context())
        self.deadline = deadline

    def connect(self) -> None:
        self.timeout = self.deadline.left()
        # watch the plain socket as soon as it exists: the TLS handshake can drip too
        real = socket.create_connection
        deadline = self.deadline

        def create(*args: Any, **kwargs: Any) -> socket.socket:
            return deadline.watch(real(*args, **kwargs))

        self._create_connection = create
        super().connect()


class SMTP(smtplib.SMTP):
    """smtplib.SMTP whose socket ends at ``deadline`` (the greeting included)."""

    def __init__(self, host: str, port: int, deadline: Deadline):
        self.deadline = deadline
        super().__init__(host, port, timeout=deadline.left())

    def _get_socket(self, host, port, timeout):   # smtplib's hook for its connection
        sock = super()._get_socket(host, port, self.deadline.left())  # type: ignore[misc]
        return self.deadline.watch(sock)

    def starttls(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        """STARTTLS, and the TLS socket it leaves watched by the deadline too (the plain one
        it wrapped is gone)."""
        reply = super().starttls(*args, **kwargs)
        if self.sock is not None:
            self.deadline.watch(self.sock)
        return reply


class SMTP_SSL(smtplib.SMTP_SSL):
    """smtplib.SMTP_SSL (implicit TLS, port 465) whose socket ends at ``deadline``."""

    def __init__(self, host: str, port: int, deadline: Deadline, context: ssl.SSLContext):
        self.deadline = deadline
        super().__init__(host, port, timeout=deadline.left(), context=context)

    def _get_socket(self, host, port, timeout):   # the TLS socket, watched
        sock = super()._get_socket(host, port, self.deadline.left())  # type: ignore[misc]
        return self.deadline.watch(sock)

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


def tls_files(folder) -> tuple[str, str, str]:
    """A certificate authority and a server certificate for 127.0.0.1 it signed, written to
    ``folder`` as PEM: (ca.pem, server.pem, server.key). What a university relay has, made
    here (the client verifies the server against ca.pem, as it would against the system's)."""
    import datetime
    import ipaddress
    from pathlib import Path

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = Path(folder)
    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject, key, issuer, issuer_key, ca: bool):
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                 x509.DNSName("localhost")]), False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "iadeep test CA")])
    ca = cert(ca_name, ca_key, ca_name, ca_key, True)
    server = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), key,
                  ca_name, ca_key, False)
    paths = (folder / "ca.pem", folder / "server.pem", folder / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return tuple(str(p) for p in paths)   # type: ignore[return-value]


class MailSink:
    """An SMTP server taking every message; ``messages`` holds them as parsed e-mails.
    ``tls``: "starttls" (offered and required before anything is taken) or "tls" (implicit,
    as on port 465), with ``cert`` (server.pem, server.key); ``login``: the (user, password)
    it requires, over TLS only (``logins`` records every attempt's user and its outcome)."""

    def __init__(self, tls: str | None = None, cert: tuple[str, str] | None = None,
                 login: tuple[str, str] | None = None):
        import ssl

        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult

        self.messages: list[email.message.EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.logins: list[tuple[str, bool]] = []
        self.lock = threading.Lock()
        self.port = free_port()
        kwargs: dict = {}
        if tls is not None:
            assert cert is not None
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*cert)
            if tls == "starttls":
                kwargs.update(tls_context=context, require_starttls=True)
            else:
                kwargs.update(ssl_context=context)
        if login is not None:
            def authenticate(server, session, envelope, mechanism, auth_data):
                user = auth_data.login.decode()
                ok = (user, auth_data.password.decode()) == login
                with self.lock:
                    self.logins.append((user, ok))
                return AuthResult(success=ok, handled=False)   # handled: it replies 535
            # over implicit TLS aiosmtpd does not know its session is encrypted (it sets that
            # on STARTTLS): there every connection is, so it may offer AUTH at once
            kwargs.update(auth_required=True, authenticator=authenticate,
                          auth_require_tls=tls != "tls")
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port, **kwargs)

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
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    body = json.loads(raw)
                else:   # a plain-text service's (ntfy): the text and its headers
                    body = {"raw": raw.decode(), "headers": dict(self.headers.items())}
                with sink.lock:
                    sink.visits.append(("POST", self.path))
                    sink.requests.append(body)
                    failing = len(sink.requests) <= sink.fail_first
                if sink.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", sink.redirect_to)
                    self.end_headers()
                    return
                sink.hold.wait(600)   # a test that holds it sets it again (and so does exit)
                if not failing:   # recorded before the answer: once the sender has it, it is here
                    with sink.lock:
                        sink.accepted.append(body)
                self.send_response(500 if failing else 200)
                self.end_headers()
                self.wfile.write(b"no" if failing else b"ok")

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

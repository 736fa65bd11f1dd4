"""The controller's Unix socket server.

Identity: ``SO_PEERCRED`` gives the connecting process's uid, which the kernel vouches for;
the user name is looked up from it. The socket is world-connectable (0666) so every lab member
can submit, and that is safe precisely because nobody can claim another uid.

Only one controller may run per state directory: an exclusive ``flock`` on ``controller.lock``
is held for the process's lifetime (the kernel drops it if the process dies, even by SIGKILL).
"""
from __future__ import annotations

import fcntl
import logging
import os
import pwd
import socket
import socketserver
import struct
import threading
from pathlib import Path

from ..errors import ControllerUnavailable, IadeepError
from . import protocol
from .service import Service

log = logging.getLogger("iadeep.controller")


def peer_user(sock: socket.socket) -> str:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        service: Service = self.server.service  # type: ignore[attr-defined]
        try:
            request = protocol.recv(self.request)
            if not isinstance(request, dict):
                return
            user = peer_user(self.request)
            result = service.handle(str(request.get("op")), dict(request.get("args") or {}), user)
            reply = {"ok": True, "result": result}
        except IadeepError as exc:
            reply = {"ok": False, "error": exc.to_dict()}
        except (ValueError, TypeError, OSError) as exc:
            reply = {"ok": False, "error": {"type": "InputError", "message": f"bad request: {exc}"}}
        except Exception as exc:  # a bug: log it, and still answer the client in one line
            log.exception("request failed")
            reply = {"ok": False, "error": {
                "type": "IadeepError", "message": f"the controller failed: {type(exc).__name__}: "
                f"{exc}", "hint": "see the controller's log; this is a bug worth reporting"}}
        try:
            protocol.send(self.request, reply)
        except OSError:
            pass  # the client went away; a retried 'add' is de-duplicated by its token


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # a lab submitting a batch from many shells at once


class ControllerSocket:
    """Binds the socket (after taking the lock) and serves requests in a background thread."""

    def __init__(self, service: Service, state_dir: Path):
        self.state_dir = state_dir
        self.path = state_dir / "controller.sock"
        state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(state_dir, 0o755)
        self._lock_file = open(state_dir / "controller.lock", "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise ControllerUnavailable(
                f"another controller is already running for {state_dir}",
                hint="stop it first, or use another IADEEP_HOME") from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(f"{os.getpid()}\n")
        self._lock_file.flush()
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()  # left by a crashed controller; we hold the lock, so it is stale
        self._server = _Server(str(self.path), _Handler)
        os.chmod(self.path, 0o666)
        self._server.service = service  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2}, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self._lock_file.close()

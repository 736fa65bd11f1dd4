"""The controller's Unix socket server.

Identity: ``SO_PEERCRED`` gives the connecting process's uid, which the kernel vouches for;
the user name is looked up from it. The socket is world-connectable (0666) so every lab member
can submit, and that is safe precisely because nobody can claim another uid.

Every local account can connect, so no account, and no handful of accounts, may take the
controller away from the others (before these limits, 1,100 idle connections from one user
used up the 1,024 file descriptors of a systemd service; later, 4 accounts x 40 idle
connections filled the global caps and another member was refused 19 times in 20):
- in total at most a quarter of the open-file limit (``connection_cap``, at most
  ``MAX_CONNECTIONS``), so the scheduling loop's database and SSH connections always have
  descriptors; of these, ``reserve(cap)`` are kept for accounts with fewer than
  ``RESERVE_USE`` connections open, and one account may hold at most ``per_user_cap(cap)``
  (``MAX_PER_USER`` when the limit allows). So however many connections a few accounts hold,
  another member's command gets in, until more than ``reserve / RESERVE_USE`` accounts
  flood at once. One more is refused at once with a one-line ``ControllerBusy`` reply;
- a request must arrive whole within ``REQUEST_TIMEOUT_S`` of connecting (idle and slow
  clients are dropped) and be at most ``protocol.MAX_REQUEST`` bytes;
- a request is answered only in one of ``PLACES`` places, and one longer than
  ``protocol.SMALL_REQUEST`` (a submission with its script) read on only in one of
  ``UPLOADS`` upload places; an account holds at most ``PLACES_PER_USER`` of each, and the
  last ``PLACES_RESERVE`` places go only to accounts holding none, so slow uploads or unread
  replies of two or three accounts never make another member's ``status`` wait. All requests
  and replies together hold at most ``connection_cap() x SMALL_REQUEST + UPLOADS x
  MAX_REQUEST + PLACES x a reply`` bytes, and a client that does not read its reply holds one
  place.
The accept loop and each connection run in their own threads; the scheduling loop runs in
the main thread and shares nothing with clients but the store.

Only one controller may run per state directory: an exclusive ``flock`` on ``controller.lock``
is held for the process's lifetime (the kernel drops it if the process dies, even by SIGKILL).
"""
from __future__ import annotations

import collections
import fcntl
import logging
import os
import pwd
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable

from ...errors import ControllerBusy, ControllerUnavailable, IadeepError, InputError
from ...paths import StateDir
from ...store import is_damage
from .. import protocol
from .service import Service

log = logging.getLogger("iadeep.controller")

MAX_PER_USER = 32          # a lab member's busiest shell scripts stay far below it
MAX_CONNECTIONS = 256      # in total, when the open-file limit allows (connection_cap)
RESERVE_USE = 2            # accounts with fewer connections than this may use the reserve
REQUEST_TIMEOUT_S = 5.0    # `iadeep` sends its request the moment it has connected
REPLY_TIMEOUT_S = 10.0     # a client that stops reading its reply is dropped
PLACES = 8                 # requests answered at once
UPLOADS = 4                # requests read past SMALL_REQUEST at once
PLACES_PER_USER = 2        # of each, per account
PLACES_RESERVE = 2         # the last places (and uploads) only for accounts holding none
PLACE_WAIT_S = 30.0        # how long one waits for a place before it is refused as busy
LISTEN_BACKLOG = 256       # a lab submitting a batch from many shells at once


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def connection_cap(soft: int | None = None) -> int:
    """Client connections at once: a quarter of the open-file limit (``soft``: this
    process's; the rest is for the database, the nodes' SSH connections and the loop), at
    most ``MAX_CONNECTIONS``."""
    if soft is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(4, min(MAX_CONNECTIONS, soft // 4))


def reserve(cap: int) -> int:
    """Connections of the ``cap`` kept for accounts that hold fewer than ``RESERVE_USE``."""
    return max(RESERVE_USE, cap // 4)


def per_user_cap(cap: int) -> int:
    """Connections one account may hold: ``MAX_PER_USER``, but never more than a quarter of
    what is left outside the reserve, so it takes four accounts to fill even that part."""
    return max(RESERVE_USE, min(MAX_PER_USER, (cap - reserve(cap)) // 4))


def _failure(exc: IadeepError) -> dict:
    return {"ok": False, "error": exc.to_dict()}


class _Places:
    """Places for answering requests (or reading long ones): at most ``places`` at once,
    ``per_uid`` per account, and the last ``reserved`` only for an account holding none, so
    a few accounts cannot hold them all. A place is taken whole, so requests never wait on
    each other's partial reads."""

    def __init__(self, places: int, per_uid: int = PLACES_PER_USER,
                 reserved: int = PLACES_RESERVE):
        self.places = places
        self.per_uid = per_uid
        self.reserved = reserved
        self._by_uid: collections.Counter[int] = collections.Counter()
        self._cond = threading.Condition()

    def _free_for(self, uid: int) -> bool:
        taken, mine = sum(self._by_uid.values()), self._by_uid[uid]
        if mine >= self.per_uid or taken >= self.places:
            return False
        return taken < self.places - self.reserved or mine == 0

    def take(self, uid: int) -> float:
        """Wait for a place for ``uid`` (ControllerBusy after ``PLACE_WAIT_S``); returns the
        seconds waited, which do not count against the client's deadline."""
        start = time.monotonic()
        with self._cond:
            while not self._free_for(uid):
                left = start + PLACE_WAIT_S - time.monotonic()
                if left <= 0:
                    raise ControllerBusy(f"the controller is busy: no place to answer this "
                                         f"request within {PLACE_WAIT_S:g} s",
                                         hint="try again in a moment")
                self._cond.wait(left)
            self._by_uid[uid] += 1
        return time.monotonic() - start

    def give(self, uid: int) -> None:
        with self._cond:
            self._by_uid[uid] -= 1
            if self._by_uid[uid] <= 0:
                del self._by_uid[uid]
            self._cond.notify_all()


class ControllerSocket:
    """Binds the socket (after taking the lock) and serves requests in background threads."""

    def __init__(self, service: Service, state: StateDir):
        self.service = service
        self.path = state.socket
        state.root.mkdir(parents=True, exist_ok=True)
        os.chmod(state.root, 0o755)
        self._lock_file = open(state.lock, "a+")  # noqa: SIM115 (held: flock)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise ControllerUnavailable(
                f"another controller is already running for {state.root}",
                hint="stop it first, or use another IADEEP_HOME") from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(f"{os.getpid()}\n")
        self._lock_file.flush()
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()  # left by a crashed controller; we hold the lock, so it is stale
        # Bound, opened to all and listening under a name of its own, then moved into place: a
        # client that sees the socket (a script waiting for it) connects at once, never in the
        # moment between bind() and listen(), where it was refused as "not running". The name
        # is as long as the socket's (".controller.new"), so a path too long for a Unix
        # socket still fails at bind(), as before.
        fresh = self.path.with_name(f".{self.path.stem}.new")
        fresh.unlink(missing_ok=True)   # left by a crashed start; we hold the lock
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(fresh))
        os.chmod(fresh, 0o666)
        self._listener.listen(LISTEN_BACKLOG)
        os.replace(fresh, self.path)
        self._listener.settimeout(0.2)   # how often the accept loop checks for close()
        self.max_connections = connection_cap()
        self.reserved = reserve(self.max_connections)
        self.per_user = per_user_cap(self.max_connections)
        self._open: collections.Counter[int] = collections.Counter()   # connections per uid
        self._count_lock = threading.Lock()
        self._places = _Places(PLACES)
        self._uploads = _Places(UPLOADS)
        self._warned_at: dict[object, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="iadeep-socket",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._listener.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self._lock_file.close()

    # ------------------------------------------------------------------ connections
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:   # e.g. EMFILE: the caps should prevent it; never spin
                self._warn("accept", f"cannot accept a connection: {exc}")
                time.sleep(0.1)
                continue
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        """Serve ``conn`` in a thread of its own, or refuse it at once if over a cap."""
        try:
            uid = peer_uid(conn)
        except OSError:
            conn.close()
            return
        with self._count_lock:
            refusal = self._refusal(uid)
            if refusal is None:
                self._open[uid] += 1
        if refusal is not None:
            self._warn(uid, f"refusing connections: {refusal.message}")
            conn.setblocking(False)
            try:
                conn.send(protocol.encode(_failure(refusal)))
            except OSError:
                pass
            conn.close()
            return
        try:
            threading.Thread(target=self._serve, args=(conn, uid), daemon=True).start()
        except RuntimeError as exc:   # no thread to be had: as busy as it gets
            self._warn("thread", f"cannot start a request thread: {exc}")
            conn.close()
            self._release(uid)

    def _refusal(self, uid: int) -> ControllerBusy | None:
        mine, total = self._open[uid], sum(self._open.values())
        if mine >= self.per_user:
            return ControllerBusy(
                f"{user_name(uid)} already has {self.per_user} connections to the controller "
                "open; this one is refused",
                hint=f"wait for your other iadeep commands to finish (connections that send "
                     f"nothing are closed after {REQUEST_TIMEOUT_S:g} s)")
        if total >= self.max_connections or (
                total >= self.max_connections - self.reserved and mine >= RESERVE_USE):
            return ControllerBusy(
                f"the controller is serving {total} connections already; "
                "this one is refused", hint="try again in a moment")
        return None

    def _release(self, uid: int) -> None:
        with self._count_lock:
            self._open[uid] -= 1
            if self._open[uid] <= 0:
                del self._open[uid]

    def _warn(self, key: object, message: str) -> None:
        """Log ``message`` at most once a minute per ``key`` (a flood must not flood the log)."""
        now = time.monotonic()
        if now - self._warned_at.get(key, -60.0) >= 60.0:
            self._warned_at[key] = now
            log.warning("%s", message)

    def _serve(self, conn: socket.socket, uid: int) -> None:
        held = uploading = False

        def upload() -> float:
            """Hold an upload place to read on past SMALL_REQUEST; the seconds waited."""
            nonlocal uploading
            waited = self._uploads.take(uid)
            uploading = True
            return waited

        def place() -> float:
            """Hold a place to answer in (once); returns the seconds waited for it."""
            nonlocal held
            if held:
                return 0.0
            waited = self._places.take(uid)
            held = True
            return waited

        try:
            reply = self._reply(conn, uid, upload, place)
            if reply is not None:
                conn.settimeout(REPLY_TIMEOUT_S)
                protocol.send(conn, reply)
        except OSError:
            pass  # the client went away; a retried 'add' is de-duplicated by its token
        finally:
            conn.close()
            if held:
                self._places.give(uid)
            if uploading:
                self._uploads.give(uid)
            self._release(uid)

    def _reply(self, conn: socket.socket, uid: int, upload: Callable[[], float],
               place: Callable[[], float]) -> dict | None:
        """The reply to the one request on ``conn``; None if the client left before sending."""
        try:
            request = protocol.read_request(conn, time.monotonic() + REQUEST_TIMEOUT_S, upload)
        except TimeoutError:
            return _failure(InputError(
                f"no complete request within {REQUEST_TIMEOUT_S:g} s of connecting; "
                "connection closed", hint="send the request as soon as you connect"))
        except IadeepError as exc:
            return _failure(exc)
        if request is None:
            return None
        try:
            place()
            op, args = protocol.parse_request(request)
            return {"ok": True, "result": self.service.handle(op, args, user_name(uid))}
        except IadeepError as exc:
            return _failure(exc)
        except Exception as exc:  # a bug: log it, and still answer the client in one line
            if is_damage(exc):   # not a bug: the database is damaged (the heartbeat says so)
                damaged = self.service.store.check_damage()
                if damaged is not None:
                    return _failure(damaged)
            log.exception("request failed")
            return {"ok": False, "error": {
                "type": "IadeepError", "message": f"the controller failed: {type(exc).__name__}: "
                f"{exc}", "hint": "see the controller's log; this is a bug worth reporting"}}

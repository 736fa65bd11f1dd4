"""One persistent, host-key-checked SSH connection per node (paramiko, imported lazily).

Why this shape:
- ``~/.ssh/config`` is honoured (Host aliases, HostName, User, Port, IdentityFile, ProxyJump,
  ProxyCommand) so a lab's existing setup just works; the inventory's host/port/user/
  identity_file override it. ProxyCommand runs as the controller's account, from its own
  config file (whoever may write that file is the controller already).
- Host keys are checked against the user's ``~/.ssh/known_hosts`` AND iadeep's own
  (``StateDir.known_hosts``).  An unknown key is refused (a ``RejectPolicy``) with a hint to
  run ``iadeep nodes trust NODE``; a CHANGED key is refused and never replaced automatically.
- The connection is opened once and reused by every poll and launch (paramiko multiplexes
  channels); a broken one is reopened, with exponential backoff so a dead node costs nothing.
- Every failure is a ``NodeError``/``HostKeyError`` naming the node, never a paramiko exception.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import getpass
import hashlib
import logging
import os
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol

from ..errors import HostKeyError, NodeError
from ..paths import StateDir
from ..settings import Node
from .connection import as_command

if TYPE_CHECKING:
    import paramiko

    # what a connection's stream may be: a ProxyJump hop's channel or a ProxyCommand
    _Sock = paramiko.Channel | paramiko.ProxyCommand


def default_known_hosts() -> tuple[Path, ...]:
    """The files whose keys we trust: the user's known_hosts, then iadeep's own."""
    return (Path("~/.ssh/known_hosts").expanduser(), StateDir.default().known_hosts)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint, so users can compare with ``ssh-keygen -lf``."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# --------------------------------------------------------------------------- target resolution
@dataclass(frozen=True)
class SshTarget:
    """Where and as whom to connect, after ~/.ssh/config and the inventory were applied."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    proxy_jump: str | None = None
    # ~/.ssh/config's ProxyCommand, its %h %p %r already expanded (paramiko's lookup does);
    # used when no ProxyJump is given (OpenSSH takes whichever comes first; here ProxyJump)
    proxy_command: str | None = None

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def _ssh_config(path: Path | None = None) -> paramiko.SSHConfig:
    import paramiko

    path = path or Path("~/.ssh/config").expanduser()
    if not path.is_file():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except Exception as exc:  # paramiko raises ConfigParseError & friends
        raise NodeError(f"{path}: cannot parse SSH config: {exc}",
                        hint="fix that file (check it with `ssh -G HOST`)") from None


def resolve_target(host: str, *, port: int | None = None, user: str | None = None,
                   identity_file: str | None = None, ssh_config_path: Path | None = None
                   ) -> SshTarget:
    """Apply ``~/.ssh/config`` for ``host`` (an alias or a name), then explicit overrides."""
    cfg = _ssh_config(ssh_config_path).lookup(host)
    idents = (identity_file,) if identity_file else tuple(cfg.get("identityfile", ()))
    jump = cfg.get("proxyjump")
    target = SshTarget(
        hostname=cfg.get("hostname", host),
        port=port or int(cfg.get("port", 22)),
        user=user or cfg.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(i) for i in idents),
        proxy_jump=None if not jump or jump.lower() == "none" else jump,
    )
    # None for "none"; its %h %p %r as the config gives them (`ssh -G HOST` shows the same)
    command = cfg.get("proxycommand")
    return dataclasses.replace(target, proxy_command=command or None)


def node_target(node: Node, ssh_config_path: Path | None = None) -> SshTarget:
    return resolve_target(node.host, port=node.port, user=node.user,
                          identity_file=node.identity_file, ssh_config_path=ssh_config_path)


def _parse_hop(hop: str) -> tuple[str, str | None, int | None]:
    """``[user@]host[:port]`` -> (host, user, port) for one ProxyJump hop."""
    user, _, rest = hop.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return host, user or None, port


# --------------------------------------------------------------------------- host keys
def _load_host_keys(files: Sequence[Path]) -> paramiko.HostKeys:
    """known_hosts entries from ``files``, line by line. Lines with a marker (@cert-authority,
    @revoked) or that paramiko cannot parse are skipped: their keys stay untrusted, and one odd
    line must not stop every connection (paramiko's own loader raises on them)."""
    import paramiko
    from paramiko.hostkeys import HostKeyEntry

    keys = paramiko.HostKeys()
    for f in files:
        if not Path(f).is_file():
            continue
        try:
            lines = Path(f).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as exc:
            raise HostKeyError(f"{f}: cannot read known_hosts: {exc.strerror}",
                               hint="check the file's permissions") from None
        for line in lines:
            line = line.strip()
            if not line or line.startswith(("#", "@")):
                continue
            try:
                entry = HostKeyEntry.from_line(line)
            except Exception:  # an unsupported key type or a corrupt line
                continue
            if entry is not None and entry.key is not None:
                for name in entry.hostnames:
                    keys.add(name, entry.key.get_name(), entry.key)
    return keys


def _changed_key_error(node_name: str, target: SshTarget, files: Sequence[Path],
                       key: paramiko.PKey) -> HostKeyError:
    name = target.known_hosts_name
    holder = next((f for f in files if Path(f).is_file() and _load_host_keys([f]).lookup(name)),
                  files[0] if files else "known_hosts")
    return HostKeyError(
        f"node {node_name}: host key for {name} has CHANGED (now {key.get_name()} "
        f"{fingerprint(key)}); refusing to connect",
        hint=f"if the node was reinstalled, remove the old line with "
             f"`ssh-keygen -R {shlex.quote(name)} -f {holder}`, then `iadeep nodes trust "
             f"{node_name}`; otherwise someone may be intercepting the connection")


def _unknown_key_error(node_name: str, name: str, key: paramiko.PKey) -> HostKeyError:
    return HostKeyError(
        f"node {node_name}: unknown host key for {name} ({key.get_name()} {fingerprint(key)})",
        hint=f"if that fingerprint is the node's, run `iadeep nodes trust {node_name}`")


def _refusing_policy(node_name: str) -> paramiko.MissingHostKeyPolicy:
    """A RejectPolicy whose refusal says how to trust the key (never adds it)."""
    import paramiko

    class Refuse(paramiko.RejectPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> NoReturn:
            raise _unknown_key_error(node_name, hostname, key)

    return Refuse()


@dataclass(frozen=True)
class ScannedKey:
    """A node's host key as offered now, and what our known_hosts files say about it."""

    node: str
    known_hosts_name: str
    key_type: str
    fingerprint: str
    line: str                 # the known_hosts line that would trust it
    status: str               # "new" | "trusted" | "changed"


# --------------------------------------------------------------------------- the connection
# File operations (SFTP sessions, log reads) open at once per node: well under sshd's default
# MaxSessions (10), which polls, launches and cancels share; past it sshd refuses new channels.
MAX_SFTP_SESSIONS = 4
_KINDS = ((stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISDIR, "directory"),
          (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
          (stat.S_ISSOCK, "socket"))


class StatLike(Protocol):
    """What ``regular_size`` reads of a stat result (``os.stat_result``, ``_Stat``)."""

    @property
    def st_mode(self) -> int | None: ...

    @property
    def st_size(self) -> int | None: ...


def regular_size(node: str, path: str, st: StatLike) -> int:
    """The size ``st`` (an lstat/fstat result) gives, if it is a regular file's; else NodeError.

    Files on a node are the jobs' to shape: a FIFO blocks whoever opens it, a device never
    ends, a symlink points anywhere; only a regular file has a size that bounds a read.
    """
    mode = st.st_mode or 0
    if stat.S_ISREG(mode):
        return int(st.st_size or 0)
    kind = next((name for test, name in _KINDS if test(mode)), "special file")
    raise NodeError(f"node {node}: {path} is a {kind}, not a regular file; not reading it",
                    hint="iadeep reads only regular files from nodes; the job may have "
                         "replaced it")


class SshConnection:
    """A node's one reusable SSH connection (a ``NodeConnection``); thread-safe (channels are
    multiplexed).

    ``connect_timeout`` bounds TCP connect, the SSH banner and authentication; ``command_timeout``
    bounds each command unless the caller passes its own.  After a failed connect the next try
    waits ``backoff_base * 2**k`` seconds (capped); calls before then fail at once.
    """

    def __init__(self, node: Node, *, known_hosts: Sequence[Path] | None = None,
                 connect_timeout: float = 5.0, command_timeout: float = 20.0,
                 backoff_base: float = 1.0, backoff_max: float = 60.0,
                 ssh_config_path: Path | None = None):
        self.node = node
        self.known_hosts = tuple(known_hosts) if known_hosts is not None else default_known_hosts()
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.ssh_config_path = ssh_config_path
        self._lock = threading.Lock()
        self._sftp_slots = threading.BoundedSemaphore(MAX_SFTP_SESSIONS)
        self._client: paramiko.SSHClient | None = None
        self._jumps: list[paramiko.SSHClient] = []
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: NodeError | None = None

    # -- connecting
    def _open_client(self, target: SshTarget, sock: _Sock | None = None,
                     hostkey_node: str | None = None) -> paramiko.SSHClient:
        import paramiko

        # paramiko logs a failed handshake with a traceback at ERROR; our NodeError says it
        logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)
        _check_identity_files(self.node.name, target)
        client = paramiko.SSHClient()
        trusted = client.get_host_keys()
        for name, by_type in _load_host_keys(self.known_hosts).items():
            for key_type, key in by_type.items():
                trusted.add(name, key_type, key)
        client.set_missing_host_key_policy(_refusing_policy(hostkey_node or self.node.name))
        t = self.connect_timeout
        began = time.monotonic()
        try:
            client.connect(
                target.hostname, port=target.port, username=target.user,
                # paramiko takes a list of key files too (its stub says one str)
                key_filename=list(target.identity_files) or None,  # type: ignore[arg-type]
                timeout=t, banner_timeout=t,
                auth_timeout=t, channel_timeout=t, sock=sock, allow_agent=True,
                look_for_keys=not target.identity_files)
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise _changed_key_error(hostkey_node or self.node.name, target, self.known_hosts,
                                     exc.key) from None
        except HostKeyError:
            client.close()
            raise
        except paramiko.AuthenticationException as exc:
            client.close()
            raise NodeError(f"node {self.node.name}: authentication failed for "
                            f"{target.user}@{target.hostname}:{target.port}: {exc}",
                            hint="check the node's identity_file / ssh-agent and the remote "
                                 "authorized_keys (passwords are not supported)") from None
        except TimeoutError as exc:
            client.close()
            if sock is not None and target.proxy_command and not target.proxy_jump:
                raise _connect_error(self.node.name, target, exc) from None   # its command's
            raise NodeError(f"node {self.node.name}: no answer from {target.hostname}:"
                            f"{target.port} within {t:g} s",
                            hint="check that the node is up and sshd is running") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            client.close()
            proxied = sock is not None and target.proxy_command and not target.proxy_jump
            if time.monotonic() - began >= 0.9 * t and not proxied:   # silent all along
                raise NodeError(f"node {self.node.name}: no answer from {target.hostname}:"
                                f"{target.port} within {t:g} s",
                                hint="check that the node is up and sshd is running") from None
            raise _connect_error(self.node.name, target, exc) from None
        return client

    def _sock_via(self, jump: str, target: SshTarget) -> paramiko.Channel | None:
        """Open a channel to ``target`` through each ProxyJump hop (left to right)."""
        sock: paramiko.Channel | None = None
        hops = [h.strip() for h in jump.split(",") if h.strip()]
        for i, hop in enumerate(hops):
            host, user, port = _parse_hop(hop)
            hop_target = resolve_target(host, port=port, user=user,
                                        ssh_config_path=self.ssh_config_path)
            client = self._open_client(hop_target, sock=sock,
                                       hostkey_node=f"{self.node.name} (jump host {host})")
            self._jumps.append(client)
            nxt = target if i == len(hops) - 1 else None
            if nxt is None:
                h2, u2, p2 = _parse_hop(hops[i + 1])
                nxt = resolve_target(h2, port=p2, user=u2, ssh_config_path=self.ssh_config_path)
            try:
                sock = _transport(client).open_channel(
                    "direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0),
                    timeout=self.connect_timeout)
            except Exception as exc:
                raise NodeError(f"node {self.node.name}: jump host {host} cannot reach "
                                f"{nxt.hostname}:{nxt.port}: {exc}",
                                hint="check ProxyJump in ~/.ssh/config") from None
        return sock

    def _connect(self) -> paramiko.SSHClient:
        target = node_target(self.node, self.ssh_config_path)
        sock: _Sock | None
        if target.proxy_jump:
            sock = self._sock_via(target.proxy_jump, target)
        elif target.proxy_command:
            sock = self._proxy_command(target)
        else:
            sock = None
        return self._open_client(target, sock=sock)

    def _proxy_command(self, target: SshTarget) -> paramiko.ProxyCommand:
        """The connection's stream through ~/.ssh/config's ProxyCommand (a child process whose
        stdin/stdout carry the SSH session, as OpenSSH runs it)."""
        import paramiko

        assert target.proxy_command is not None
        try:
            return paramiko.ProxyCommand(target.proxy_command)
        except (OSError, paramiko.ProxyCommandFailure) as exc:
            raise NodeError(f"node {self.node.name}: its ProxyCommand did not start: {exc}",
                            hint="check ProxyCommand in ~/.ssh/config (try it with "
                                 f"`ssh -G {self.node.host}`)") from None

    def client(self) -> paramiko.SSHClient:
        """The live paramiko client, (re)connecting if needed; honours the backoff."""
        with self._lock:
            if self._client is not None and _active(self._client):
                return self._client
            self._drop_locked()
            now = time.monotonic()
            if now < self._retry_at and self._last_error is not None:
                err = self._last_error
                raise type(err)(f"{err.message} (next retry in {self._retry_at - now:.0f} s)",
                                err.hint)
            try:
                self._client = self._connect()
            except NodeError as exc:
                self._drop_locked()
                self._failures += 1
                delay = min(self.backoff_max, self.backoff_base * 2 ** (self._failures - 1))
                self._retry_at = time.monotonic() + delay
                self._last_error = exc
                raise
            self._failures, self._retry_at, self._last_error = 0, 0.0, None
            return self._client

    def _drop_locked(self) -> None:
        for c in [self._client, *reversed(self._jumps)]:
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass
        self._client, self._jumps = None, []

    def close(self) -> None:
        with self._lock:
            self._drop_locked()

    @property
    def connected(self) -> bool:
        c = self._client
        return c is not None and _active(c)

    # -- commands
    def run(self, command: str | Sequence[str], timeout: float | None = None,
            stdin: bytes | None = None) -> tuple[int, str, str]:
        """Run a command (string: through the login shell; list: quoted argv); (rc, out, err).

        A connection that went stale while idle is reopened once; a command that outlives its
        timeout raises NodeError (the channel is closed, the connection kept).
        """
        cmd = as_command(command)
        timeout = self.command_timeout if timeout is None else timeout
        was_connected = self.connected
        try:
            return self._run_once(cmd, timeout, stdin)
        except _Stale:
            if not was_connected:
                raise NodeError(f"node {self.node.name}: connection lost", None) from None
            self.close()
            try:
                return self._run_once(cmd, timeout, stdin)
            except _Stale as exc:
                raise NodeError(f"node {self.node.name}: connection lost: {exc}",
                                hint="the node or its sshd went away; it is retried "
                                     "automatically") from None

    def _run_once(self, cmd: str, timeout: float, stdin: bytes | None) -> tuple[int, str, str]:
        import paramiko

        client = self.client()
        deadline = time.monotonic() + timeout
        chan = self._open_channel(client, timeout)
        try:
            chan.exec_command(cmd)
            if stdin is not None:
                chan.sendall(stdin)
            _shutdown_write(chan)
            out = _read_all(chan.recv, chan, deadline)
            err = _read_all(chan.recv_stderr, chan, deadline)
            while not chan.status_event.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
                if not _active(client):
                    break
                if time.monotonic() >= deadline:
                    raise TimeoutError()
            rc = chan.exit_status
        except _TooMuchOutput:
            raise NodeError(f"node {self.node.name}: a command printed more than "
                            f"{MAX_OUTPUT // 2**20} MiB; its output was discarded",
                            hint="check the node's nvidia-smi and job directories") from None
        except TimeoutError:
            raise NodeError(f"node {self.node.name}: command did not finish within {timeout:g} s",
                            hint="the node is overloaded or hung; raise command_timeout if it "
                                 "is just slow") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if not self.connected:   # the connection died; one channel's failure is its own
                self.close()
            raise NodeError(f"node {self.node.name}: connection lost during a command: "
                            f"{exc or type(exc).__name__}",
                            hint="it is retried automatically on the next poll") from None
        finally:
            with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
                chan.close()   # on a connection that died meanwhile: nothing left to close
        if rc == -1:   # no exit status: the connection died, or sshd ended this session alone
            if not self.connected:
                self.close()
            raise NodeError(f"node {self.node.name}: connection lost before the command finished",
                            hint="it is retried automatically on the next poll")
        return rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def _open_channel(self, client: paramiko.SSHClient, timeout: float) -> paramiko.Channel:
        """A new session channel. sshd refusing one (past its MaxSessions, counting channels
        still closing) leaves the connection up: tried again twice after a moment, then this
        command's NodeError, never a reconnect that would cut every command in flight. So does
        sshd answering too slowly (a loaded node: waited for up to the command's ``timeout``)
        while the connection is up. Any other failure means the connection is dead
        (``_Stale``: ``run`` reconnects once)."""
        import paramiko

        transport = client.get_transport()
        if transport is None:   # closed since client() handed it out
            self.close()
            raise _Stale("the connection is closed")
        for attempt in range(3):
            try:
                return transport.open_session(timeout=max(self.connect_timeout, timeout))
            except paramiko.ChannelException as exc:
                if attempt == 2:
                    raise NodeError(f"node {self.node.name}: sshd refused a new session "
                                    f"({exc}): too many at once",
                                    hint="it is retried on the next poll; raise MaxSessions "
                                         "in the node's sshd_config if this persists") from None
                time.sleep(0.2 * (attempt + 1))
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if transport.is_active():
                    raise NodeError(f"node {self.node.name}: sshd did not open a session in "
                                    f"time ({exc or type(exc).__name__})",
                                    hint="the node is overloaded; it is retried on the next "
                                         "poll") from None
                self.close()
                raise _Stale(str(exc) or type(exc).__name__) from None
        raise AssertionError("unreachable")

    # -- files (SFTP over the same connection)
    def _take_slot(self, what: str) -> None:
        """One of the ``MAX_SFTP_SESSIONS`` file-operation slots (released by the caller)."""
        t = self.command_timeout
        if not self._sftp_slots.acquire(timeout=t):
            raise NodeError(f"node {self.node.name}: {what}: {MAX_SFTP_SESSIONS} file transfers "
                            f"to this node already in progress for {t:g} s",
                            hint="try again in a moment")

    @contextlib.contextmanager
    def _sftp(self, what: str) -> Iterator[paramiko.SFTPClient]:
        """One SFTP session for one operation; every failure inside is this node's NodeError.

        Bounded, because what is read is the jobs' to shape: at most ``MAX_SFTP_SESSIONS`` at
        once per node (sshd refuses channels past its MaxSessions, default 10, and polls and
        launches need channels too), and every request times out after ``command_timeout`` (a
        server stuck on a file cannot hang the caller).  A refused channel fails this
        operation only: the connection stays up for everything else in flight.
        """
        import paramiko

        t = self.command_timeout
        self._take_slot(what)
        chan = None
        try:
            chan = _transport(self.client()).open_session(timeout=self.connect_timeout)
            chan.settimeout(t)
            chan.invoke_subsystem("sftp")
            yield paramiko.SFTPClient(chan)
        except FileNotFoundError:
            raise
        except TimeoutError:
            raise NodeError(f"node {self.node.name}: {what}: no answer within {t:g} s",
                            hint="the node is overloaded or hung; it is retried later") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if not self.connected:
                self.close()
            raise NodeError(f"node {self.node.name}: {what}: {exc or type(exc).__name__}",
                            hint="check free space and permissions in the node's workdir, and "
                                 "that its sshd allows the sftp subsystem") from None
        finally:
            if chan is not None:
                chan.close()
            self._sftp_slots.release()

    def put(self, local: str | os.PathLike[str], remote: str, mode: int = 0o700) -> None:
        with self._sftp(f"cannot upload {local} to {remote}") as sftp:
            sftp.put(str(local), remote)
            sftp.chmod(remote, mode)

    def read(self, remote: str, offset: int, max_bytes: int) -> tuple[bytes, int] | None:
        """Up to ``max_bytes`` of a remote regular file from ``offset``, and the file's size;
        None if it is missing.  Anything else (a FIFO blocks whoever opens it, a symlink to
        /dev/zero never ends) is refused, and the size comes from stat.

        Not over SFTP: its server opens without O_NONBLOCK, so a FIFO a job swaps in after the
        stat blocks that server for good.  A shell ``dd`` opens it O_NONBLOCK|O_NOFOLLOW (a
        FIFO gives EOF at once, a link is refused), and what was read counts only if the same
        file is there after.  One exec channel each, under the same slots as SFTP.
        """
        if remote.startswith("~/"):
            remote = remote[2:]      # relative to the login directory, where commands start
        what = f"cannot read {remote}"
        t = self.command_timeout
        self._take_slot(what)
        try:
            rc, out, err = self.run(["sh", "-c", _READ_SCRIPT.format(
                path=shlex.quote(remote), timeout=f"{max(1.0, t - 1):g}",
                offset=max(0, int(offset)), count=max(0, int(max_bytes)))], timeout=t)
        finally:
            self._sftp_slots.release()
        lines = out.splitlines()
        failed = [ln for ln in err.splitlines() if ln.startswith("iadeep: ")]
        if rc != 0 or failed:
            said = (failed or err.strip().splitlines() or [f"exit {rc}"])[-1]
            raise NodeError(f"node {self.node.name}: {what}: {said.removeprefix('iadeep: ')}",
                            hint="iadeep reads only regular files from nodes; the job may have "
                                 "replaced it")
        if lines[:1] == ["missing"]:
            return None
        try:
            _, mode, size_s = lines[0].split()
            st = _Stat(int(mode, 16), int(size_s))
        except (IndexError, ValueError):
            raise NodeError(f"node {self.node.name}: {what}: unreadable answer") from None
        size = regular_size(self.node.name, remote, st)
        try:
            data = base64.b64decode("".join(lines[1:2]), validate=True)
        except ValueError:
            raise NodeError(f"node {self.node.name}: {what}: unreadable answer") from None
        return data, max(size, offset + len(data))

    # -- trust
    def scan_host_key(self) -> ScannedKey:
        """Fetch the key the node offers now (no authentication) and compare with known_hosts."""
        import paramiko

        target = node_target(self.node, self.ssh_config_path)
        known = _load_host_keys(self.known_hosts).lookup(target.known_hosts_name)
        try:
            hop = self._sock_via(target.proxy_jump, target) if target.proxy_jump else None
            sock = hop if hop is not None else \
                socket.create_connection((target.hostname, target.port), self.connect_timeout)
            t = paramiko.Transport(sock)
            if known:
                opts = t.get_security_options()
                first = next(iter(known))
                opts.key_types = [first] + [k for k in opts.key_types if k != first]
            t.banner_timeout = self.connect_timeout
            t.start_client(timeout=self.connect_timeout)
            key = t.get_remote_server_key()
            t.close()
        except NodeError:
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise NodeError(f"node {self.node.name}: cannot fetch the host key from "
                            f"{target.hostname}:{target.port}: {exc or type(exc).__name__}",
                            hint="check that the node is up and sshd is running") from None
        finally:
            self.close()
        if not known:
            status = "new"
        elif known.get(key.get_name()) == key:
            status = "trusted"
        else:
            status = "changed"
        line = f"{target.known_hosts_name} {key.get_name()} {key.get_base64()}"
        return ScannedKey(self.node.name, target.known_hosts_name, key.get_name(),
                          fingerprint(key), line, status)


def _active(client: paramiko.SSHClient) -> bool:
    """Whether the client's connection is up."""
    transport = client.get_transport()
    return transport is not None and transport.is_active()


def _transport(client: paramiko.SSHClient) -> paramiko.Transport:
    """The client's transport; a client whose connection is gone has none: an EOFError, as
    paramiko says a connection ended."""
    transport = client.get_transport()
    if transport is None:
        raise EOFError("the connection is closed")
    return transport


def _check_identity_files(node: str, target: SshTarget) -> None:
    """A key file that is named but missing is a configuration error, not a network one."""
    files = [os.path.expanduser(f) for f in target.identity_files]
    if files and not any(os.path.isfile(f) for f in files):
        raise NodeError(f"node {node}: identity_file {', '.join(target.identity_files)} does not "
                        "exist on the controller's machine",
                        hint="fix identity_file in the inventory (or IdentityFile in "
                             "~/.ssh/config), or create the key with ssh-keygen")


def _connect_error(node: str, target: SshTarget, exc: BaseException) -> NodeError:
    """One line that says what the failure means, with the fix that fits it."""
    where = f"{target.hostname}:{target.port}"
    text = str(exc)
    if target.proxy_command and not target.proxy_jump:   # the stream was the command's
        return NodeError(f"node {node}: no SSH session through its ProxyCommand "
                         f"({target.proxy_command[:120]}) to {where}: "
                         f"{text or type(exc).__name__}",
                         hint="run that command by hand, or check ProxyCommand in "
                              "~/.ssh/config (`ssh -G HOST` shows it)")
    if isinstance(exc, ConnectionRefusedError):
        return NodeError(f"node {node}: connection refused by {where} (the node is down or its "
                         "sshd is not running)",
                         hint="start sshd on the node; iadeep retries it automatically")
    if "protocol banner" in text or "SSH protocol" in text:
        return NodeError(f"node {node}: {where} answers but is not an SSH server",
                         hint="check the node's port in the inventory or ~/.ssh/config")
    if isinstance(exc, socket.gaierror):
        return NodeError(f"node {node}: cannot resolve host name {target.hostname!r}",
                         hint="check host in the inventory or HostName in ~/.ssh/config")
    reason = getattr(exc, "strerror", None) or text or type(exc).__name__
    return NodeError(f"node {node}: cannot connect to {where}: {reason}",
                     hint="check that the node is up and host/port in the inventory or "
                          "~/.ssh/config")


class _Stale(Exception):
    """Internal: the cached connection turned out to be dead before the command started."""


@dataclass(frozen=True)
class _Stat:
    st_mode: int
    st_size: int


# A log read on the node (POSIX sh, GNU coreutils): lstat, then dd, never blocking and never
# through a link, then the same check again: a file replaced meanwhile is said so, not read.
_READ_SCRIPT = """f={path}; t=''
command -v timeout >/dev/null 2>&1 && t='timeout -k 1 {timeout}'
set -- $(stat -c '%f %s %d:%i' -- "$f" 2>/dev/null)
[ $# = 3 ] || {{ [ -e "$f" ] || [ -h "$f" ] || {{ echo missing; exit 0; }}
  echo "iadeep: cannot stat it" >&2; exit 3; }}
echo "stat $1 $2"
[ $((0x$1 & 61440)) = 32768 ] || exit 0
{{ $t dd if="$f" iflag=nonblock,nofollow,skip_bytes,count_bytes skip={offset} count={count} \\
  bs=65536 status=none || echo "iadeep: it could not be read" >&2; }} | base64 | tr -d '\\n'; echo
[ "$(stat -c '%f %d:%i' -- "$f" 2>/dev/null)" = "$1 $3" ] || \\
  {{ echo "iadeep: it was replaced while it was read" >&2; exit 3; }}
"""

MAX_OUTPUT = 8 * 1024 * 1024   # a node's answer larger than this is refused, not buffered


class _TooMuchOutput(Exception):
    pass


def _shutdown_write(chan: paramiko.Channel) -> None:
    """``chan.shutdown_write()``, with the EOF sent while the channel's lock is held.

    paramiko builds the EOF under the lock but sends it after releasing it. A command that
    ends at once (a refused read) lets sshd's EOF and CLOSE in between: paramiko's transport
    thread answers with its own CLOSE, then our EOF goes out for a channel sshd has freed, and
    sshd drops the whole connection ("ieof packet referred to nonexistent channel"), cutting
    every command in flight (seen: one read of 30 concurrent ones, under load). Sent under
    the lock, our EOF goes first, or not at all once the channel is closing."""
    lock, build, transport = getattr(chan, "lock", None), getattr(chan, "_send_eof", None), \
        getattr(chan, "transport", None)
    if lock is None or build is None or transport is None:   # another paramiko: its own way
        chan.shutdown_write()
        return
    with lock:
        m = build()
        if m is not None:
            transport._send_user_message(m)


def _read_all(recv: Callable[[int], bytes], chan: paramiko.Channel, deadline: float) -> bytes:
    """A stream until EOF, bounded in time (``deadline``) and size (MAX_OUTPUT): what a node
    prints is untrusted, and a job or a broken driver can print without end."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chan.settimeout(max(0.001, deadline - time.monotonic()))
        data = recv(65536)
        if not data:
            return b"".join(chunks)
        size += len(data)
        if size > MAX_OUTPUT:
            raise _TooMuchOutput()
        chunks.append(data)


def record_host_key(scanned: ScannedKey, path: Path | None = None) -> Path:
    """Append a scanned key to iadeep's known_hosts (0600). A changed key is never replaced."""
    if scanned.status == "changed":
        raise HostKeyError(
            f"node {scanned.node}: host key for {scanned.known_hosts_name} has CHANGED "
            f"({scanned.key_type} {scanned.fingerprint}); not recording it",
            hint=f"remove the old line first: `ssh-keygen -R "
                 f"{shlex.quote(scanned.known_hosts_name)} -f FILE` for ~/.ssh/known_hosts "
                 f"and {StateDir.default().known_hosts}")
    path = Path(path) if path is not None else StateDir.default().known_hosts
    if scanned.status == "trusted":
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(scanned.line + "\n")
    return path

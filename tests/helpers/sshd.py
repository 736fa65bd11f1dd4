"""Real OpenSSH servers on 127.0.0.2, 127.0.0.3, ... for tests and benchmarks.

Each node is its own ``/usr/sbin/sshd -D -e -f CONFIG`` with a host key and an authorized user key
generated in a temporary directory, a random free high port (so parallel test runs never clash),
key-only login, and ``SetEnv PATH=`` a readable copy of tests/fakes, so the stand-in ``nvidia-smi``
answers (also when another OS account is the node's SSH account: see ``readable_fakes``).
``FAKE_SMI_STATE`` points each node at its own directory of behaviour files (see the stand-in).

``Cluster.home`` is a HOME for paramiko: ``.ssh/config`` with a Host alias per node and
``.ssh/known_hosts`` with every node's key (unless ``trusted=False``).
"""
from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server",
                                "/usr/lib/ssh/sftp-server") if os.path.exists(p)),
                   "internal-sftp")
HERE = Path(__file__).resolve().parents[1]   # tests/
FAKES = HERE / "fakes"
SMI_FIXTURES = HERE / "fixtures" / "nvidia-smi"


def readable_fakes(under: Path) -> Path:
    """A copy of the stand-in ``nvidia-smi`` and the real output it replays, in ``under/bin``
    (0755 directories, 0755/0644 files), for ``PATH``: the node's SSH account may be another OS
    account, which cannot execute the checkout's copy when the checkout lies under a private
    directory (a clone in a 0700 home or ``mktemp -d``)."""
    top = under / "smi-standin"
    bin_dir, data = top / "bin", top / "fixtures" / "nvidia-smi"
    for d in (top, bin_dir, top / "fixtures", data):
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o755)
    shutil.copy(FAKES / "nvidia-smi", bin_dir / "nvidia-smi")
    os.chmod(bin_dir / "nvidia-smi", 0o755)
    for f in SMI_FIXTURES.iterdir():
        if f.is_file():
            shutil.copy(f, data / f.name)
            os.chmod(data / f.name, 0o644)
    return bin_dir


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "iadeep-test", "-f",
                    str(path)], check=True)


def proc_files(name: str) -> list[Path]:
    """``/proc/PID/name`` of every process now. Not ``Path("/proc").glob(...)``: a process that
    exits during the glob makes it raise (ESRCH from its stat), which parallel test workers,
    starting and ending processes all the time, turn from rare into routine. A process may
    still be gone by the time its file is read: callers catch OSError there."""
    return [Path("/proc", pid, name) for pid in os.listdir("/proc") if pid.isdigit()]


def _wait_stopped(pid: int, limit: float = 10.0) -> None:
    """Until ``pid`` is in state T (stopped), or ``limit`` s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0] == "T":
                return
        except (OSError, IndexError):
            return
        time.sleep(0.01)


def _descendants(root: int) -> list[int]:
    """Pids below ``root`` in the process tree (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in proc_files("stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class SshdNode:
    """One sshd process; ``start``/``stop`` keep the same port, address and host key."""

    def __init__(self, name: str, addr: str, root: Path, authorized_keys: Path | str,
                 own_home: bool = True):
        """``authorized_keys``: a file, or sshd's own pattern (``.ssh/authorized_keys``: each
        account's, as on a real node). ``own_home``: sessions get HOME in this node's directory
        (fast: no root .bashrc); False keeps each account's real home."""
        self.name, self.addr = name, addr
        self.dir = root / name
        self.state = self.dir / "smi"         # FAKE_SMI_STATE: mode/gpus/sleep files
        self.state.mkdir(parents=True)
        # whatever the umask (a 077 one makes them 0700), the node's SSH account, another OS
        # account in the run_as labs, must reach the stand-in and read its state files
        for d in (self.dir, self.state):
            os.chmod(d, 0o755)
        fakes = readable_fakes(self.dir)
        home = f" HOME={self.dir}/home" if own_home else ""
        # The remote HOME: bash sources ~/.bashrc for every SSH command; this machine's root
        # .bashrc (pyenv init) costs ~0.3 s, which would dominate every test and benchmark.
        (self.dir / "home").mkdir()
        os.chmod(self.dir / "home", 0o755)
        self.host_key = self.dir / "ssh_host_ed25519_key"
        _keygen(self.host_key)
        self.port = _free_port(addr)
        self.config = self.dir / "sshd_config"
        self.config.write_text(f"""\
ListenAddress {addr}:{self.port}
HostKey {self.host_key}
PidFile {self.dir}/sshd.pid
AuthorizedKeysFile {authorized_keys}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
UseDNS no
AllowTcpForwarding yes
MaxStartups 100:30:200
MaxSessions 100
LogLevel ERROR
Subsystem sftp {SFTP_SERVER}
SetEnv PATH={fakes}:/usr/local/bin:/usr/bin:/bin FAKE_SMI_STATE={self.state}{home}
""")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        with open(self.dir / "sshd.log", "ab") as log:   # sshd keeps its own copy of the fd
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd for {self.name} exited: "
                                   f"{(self.dir / 'sshd.log').read_text()[-500:]}")
            try:
                with socket.create_connection((self.addr, self.port), timeout=1) as s:
                    s.settimeout(2)
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"sshd for {self.name} did not answer on {self.addr}:{self.port}")

    def stop(self) -> None:
        """Kill this sshd AND the per-connection processes it forked (as a crash or reboot
        would), so open client connections die too; nothing else is touched."""
        if self.proc is not None and self.proc.poll() is None:
            # Stop the listener first: stopped, it forks no new per-connection process, so the
            # list below has them all. Listed while it ran, a connection accepted in between
            # survived the kill and kept the "dead" node answering (seen under parallel load).
            os.kill(self.proc.pid, signal.SIGSTOP)
            _wait_stopped(self.proc.pid)
            for pid in _descendants(self.proc.pid):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP this sshd and its per-connection processes: a hung machine that still
        accepts TCP connections (the kernel does) but never answers."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, sig: int) -> None:
        if self.proc is None:
            return
        for pid in [self.proc.pid, *_descendants(self.proc.pid)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def new_host_key(self) -> None:
        """Replace the host key (as a reinstall would) and restart."""
        self.stop()
        self.host_key.unlink()
        Path(str(self.host_key) + ".pub").unlink()
        _keygen(self.host_key)
        self.start()

    def known_hosts_line(self) -> str:
        kind, b64 = Path(str(self.host_key) + ".pub").read_text().split()[:2]
        return f"[{self.addr}]:{self.port} {kind} {b64}"

    def set_fake(self, mode: str | None = None, gpus: int | None = None,
                 sleep: float | None = None, hold: bool = False,
                 name: str | None = None, util: float | None = None,
                 foreign: list[tuple[int, int, int, str]] | None = None) -> None:
        """Choose the stand-in nvidia-smi's behaviour on this node (None: default). ``hold``:
        it answers only once ``set_fake(hold=False)`` (a hang of the test's choosing: no
        sleep is long enough on a loaded machine and short enough on an idle one). ``name``:
        the GPU model it reports (the real H200 output with its name field rewritten), for a
        lab of mixed GPU models. ``util``: the GPU utilisation (%) it reports. ``foreign``:
        processes iadeep did not start that it lists, each (pid, GPU index, MiB, name)."""
        rows = None if foreign is None else "".join(
            f"{pid} {gpu} {mib} {pname}\n" for pid, gpu, mib, pname in foreign).rstrip("\n")
        for fname, value in (("mode", mode), ("gpus", gpus), ("sleep", sleep),
                             ("hold", 1 if hold else None), ("name", name), ("util", util),
                             ("foreign", rows)):
            f = self.state / fname
            if value is None:
                f.unlink(missing_ok=True)
            else:
                f.write_text(f"{value}\n")
                os.chmod(f, 0o644)   # read by the node's SSH account, whatever the umask

    def set_pmon(self, figures: dict[int | str, tuple[float, float]]) -> None:
        """The per-process utilisation (SM %, memory %) the stand-in's ``nvidia-smi pmon``
        reports for each job id's processes from now on (``"*"``: every job not named), and
        nothing else changed (``set_fake`` resets what it is not given)."""
        f = self.state / "pmon"
        tmp = f.with_suffix(".tmp")
        tmp.write_text("".join(f"{job} {sm:g} {mem:g}\n" for job, (sm, mem) in figures.items()))
        os.chmod(tmp, 0o644)
        tmp.replace(f)   # a poll reads the old figures or the new, never half of them


class Cluster:
    """n sshd nodes plus the HOME, inventory and keys a client needs to reach them."""

    def __init__(self, root: Path, n: int, *, first_addr: int = 2, trusted: bool = True,
                 workdir: str | None = None):
        self.root = root
        self.home = root / "home"
        ssh = self.home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        self.user = getpass.getuser()
        self.user_key = ssh / "id_ed25519"
        _keygen(self.user_key)
        authorized = root / "authorized_keys"
        shutil.copy(str(self.user_key) + ".pub", authorized)
        self.nodes = {}
        for i in range(n):
            name = f"node{i + 1:02d}"
            self.nodes[name] = SshdNode(name, f"127.0.0.{first_addr + i}", root, authorized)
        self.workdir = workdir or str(root / "remote")
        self.known_hosts = ssh / "known_hosts"
        self.write_known_hosts(trusted)
        (ssh / "config").write_text("".join(
            f"Host {name}-alias\n  HostName {node.addr}\n  Port {node.port}\n  User {self.user}\n"
            f"  IdentityFile {self.user_key}\n" for name, node in self.nodes.items()))
        self.inventory_path = root / "nodes.yaml"
        self.inventory_path.write_text(self.inventory_yaml())
        for node in self.nodes.values():
            node.start()

    def write_known_hosts(self, trusted: bool = True) -> None:
        lines = [n.known_hosts_line() for n in self.nodes.values()] if trusted else []
        self.known_hosts.write_text("".join(line + "\n" for line in lines))

    def inventory_yaml(self, names=None) -> str:
        out = ["nodes:\n"]
        for name, node in self.nodes.items():
            if names is not None and name not in names:
                continue
            out.append(f"  - name: {name}\n    host: {node.addr}\n    port: {node.port}\n"
                       f"    user: {self.user}\n    identity_file: {self.user_key}\n"
                       f"    workdir: {self.workdir}\n")
        return "".join(out)

    @property
    def inventory(self):
        from iadeep_cli.inventory import parse_inventory

        return parse_inventory(self.inventory_yaml(), self.inventory_path)

    def node(self, name: str) -> SshdNode:
        return self.nodes[name]

    def stop(self, name: str) -> None:
        self.nodes[name].stop()

    def start(self, name: str) -> None:
        self.nodes[name].start()

    def reset(self) -> None:
        """Every node running with the default stand-in behaviour (between tests), and no job
        left over from an earlier test (they would show as GPU processes on every node)."""
        self.kill_jobs()
        for node in self.nodes.values():
            node.resume()
            node.set_fake()
            node.start()

    def kill_jobs(self) -> None:
        """Kill the process groups of jobs launched under this cluster's workdir."""
        for environ in proc_files("environ"):
            try:
                env = environ.read_bytes().split(b"\0")
            except OSError:
                continue
            progress = next((e[len(b"IADEEP_PROGRESS_FILE="):] for e in env
                             if e.startswith(b"IADEEP_PROGRESS_FILE=")), b"")
            if progress.decode(errors="replace").startswith(self.workdir + "/"):
                pid = int(environ.parent.name)
                # its group, and itself: a job's child whose group leader already died is not
                # reached through killpg(its own pid)
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass

    def shutdown(self) -> None:
        self.kill_jobs()
        for node in self.nodes.values():
            node.stop()

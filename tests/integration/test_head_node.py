"""The head-node set-up of docs/administration.md, run as written on this machine: the real
accounts (`iadeep` on the
head node, `iadeep-jobs` on the node), a real sshd node that accepts the controller's new key
from the job account's own authorized_keys, the sudoers step through visudo, /etc/iadeep,
/etc/profile.d, and `nodes trust` as the controller's account in a login shell; then the unit's
ExecStart as its User with its Environment (no systemd here), and a member's job running on
the node just trusted.

Programs run as another account cannot execute this interpreter (it lives under /root here):
the `iadeep` lines run the real CLI in a process forked from this one and dropped to that
account, with the environment the line's own `sudo ... sh -lc` gives (read with real sudo).
"""
from __future__ import annotations

import contextlib
import io
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.accounts import accounts_lock, ensure_user, run_as, shared_dir
from helpers.controllers import wait_until
from helpers.sshd import SshdNode, sshd_available

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.os_global,   # accounts, /etc/iadeep, /etc/profile.d, /etc/sudoers.d, /var/lib
    pytest.mark.skipif(os.geteuid() != 0, reason="creating OS accounts needs root"),
]

ROOT = Path(__file__).resolve().parents[2]
CONTROLLER, JOBS, MEMBER = "iadeep", "iadeep-jobs", "iadeep-hn-member"
MADE = [Path("/var/lib/iadeep"), Path("/etc/iadeep"), Path("/etc/profile.d/iadeep.sh"),
        Path("/etc/sudoers.d/iadeep")]
MARK = Path("/run/iadeep-head-node-test")   # what exists was made by this test (a killed run)


def checklist() -> list[str]:
    """The commands of the set-up block in docs/administration.md, comments left out, in order."""
    text = (ROOT / "docs" / "administration.md").read_text()
    block = text.split("The whole set-up, as root, in order", 1)[1].split("```\n", 2)[1]
    return [line for line in block.splitlines() if line.strip() and
            not line.lstrip().startswith("#")]


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _clean() -> None:
    with accounts_lock():
        for name in (JOBS, CONTROLLER):
            if _exists(name):
                subprocess.run(["userdel", "--remove", name], capture_output=True)
    for path in MADE:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    MARK.unlink(missing_ok=True)


def _login_env(user: str) -> dict:
    """The environment ``sudo -u USER sh -lc '...'`` gives its command (real sudo, real
    /etc/profile and /etc/profile.d)."""
    out = subprocess.run(["sudo", "-u", user, "sh", "-lc", "env -0"], check=True,
                         capture_output=True, cwd="/").stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


_DUMP = ("import atexit, sys\n"
         "dump = sys.argv.pop(1)\n"
         "atexit.register(lambda: open(dump, 'w').write('\\n'.join(sys.modules)))\n"
         "from iadeep_cli.cli.main import main; sys.argv[0] = 'iadeep'; main()\n")


def _preload(top: Path, script: Path) -> None:
    """Import here, before any fork, every module the CLI commands below and the controller
    load (lazily): the child, as another account, cannot read this interpreter's files. They
    are learnt from the same commands run as root against a scratch state directory."""
    import importlib
    import pkgutil

    import paramiko

    scratch = top / "preload"
    scratch.mkdir()
    env = {**os.environ, "IADEEP_HOME": str(scratch), "IADEEP_INVENTORY": "/etc/iadeep/nodes.yaml"}
    dumps = []

    def run(*argv: str, stdin: str = "", wait: bool = True):
        dumps.append(scratch / f"modules-{len(dumps)}")
        cmd = [sys.executable, "-c", _DUMP, str(dumps[-1]), *argv]
        if not wait:
            return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        return subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True,
                              timeout=120)

    ctl = run("controller", "run", "--inventory", "/etc/iadeep/nodes.yaml", wait=False)
    def up() -> bool:
        assert ctl.poll() is None, "the scratch controller exited"
        return (scratch / "controller.sock").exists()
    wait_until(up, limit=120)
    job = run("queue", "add", str(script)).stdout.strip()
    for argv in (("queue", "list"), ("queue", "list", "--all"), ("queue", "cancel", job),
                 ("status",), ("nodes", "trust", "gpu1")):
        run(*argv, stdin="n\n")
    ctl.send_signal(signal.SIGTERM)
    ctl.wait(timeout=60)
    names = {n for d in dumps if d.exists() for n in d.read_text().split()}
    names |= {m.name for m in pkgutil.walk_packages(paramiko.__path__, "paramiko.")}
    for name in sorted(names):
        try:
            importlib.import_module(name)
        except Exception:   # a platform's optional module, a test-only one: not needed
            pass


def _as(user: str, env: dict, argv: list[str], stdin: str = "", log: Path | None = None,
        wait: bool = True):
    """``main()`` of the real CLI with ``argv`` in a child process running as ``user`` with
    ``env``; returns (rc, stdout, stderr), or the child's pid if not ``wait``."""
    from iadeep_cli.cli.main import main

    entry = pwd.getpwnam(user)
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.close(out_r)
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.chdir(env["HOME"] if os.path.isdir(env.get("HOME", "")) else "/")
            os.environ.clear()
            os.environ.update(env)
            if log is not None:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            sys.argv = ["iadeep", *argv]
            sys.stdin = io.StringIO(stdin)
            out, err = io.StringIO(), io.StringIO()
            try:
                if log is None:
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                        main()
                else:
                    main()
                rc = 0
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            os.write(out_w, repr((rc, out.getvalue(), err.getvalue())).encode())
        except BaseException:
            import traceback
            if log is not None:   # nobody reads the pipe of a child not waited for
                with open(log, "a") as f:
                    f.write(traceback.format_exc())
            os.write(out_w, repr((99, "", traceback.format_exc())).encode())
        finally:
            os._exit(rc if isinstance(rc, int) else 1)
    os.close(out_w)
    if not wait:
        os.close(out_r)
        return pid
    data = b""
    while chunk := os.read(out_r, 65536):
        data += chunk
    os.close(out_r)
    os.waitpid(pid, 0)
    import ast
    return ast.literal_eval(data.decode())


def _completed_nodes(env: dict) -> list[str]:
    """What Tab offers after `iadeep nodes trust/fence ` in a shell with ``env``."""
    from iadeep_cli.cli import complete

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return complete.node_names("")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _unit() -> tuple[str, dict, list[str]]:
    """deploy/iadeep-controller.service's User, Environment and ExecStart; what systemd does
    for its StateDirectory= before starting it is done here (owner and mode)."""
    text = (ROOT / "deploy" / "iadeep-controller.service").read_text()
    user = re.search(r"^User=(\S+)$", text, re.M).group(1)
    env = dict(line.split("=", 1) for line in re.findall(r"^Environment=(\S+)$", text, re.M))
    argv = shlex.split(re.search(r"^ExecStart=(.+)$", text, re.M).group(1))
    assert argv[0].endswith("/bin/iadeep"), argv
    state = Path("/var/lib") / re.search(r"^StateDirectory=(\S+)$", text, re.M).group(1)
    mode = int(re.search(r"^StateDirectoryMode=(\d+)$", text, re.M).group(1), 8)
    entry = pwd.getpwnam(user)
    state.mkdir(exist_ok=True)
    os.chown(state, entry.pw_uid, entry.pw_gid)
    os.chmod(state, mode)
    return user, env, argv[1:]


def _private_checkout() -> Path | None:
    """The directory that keeps other accounts out of this checkout (a clone under a 0700
    home or `mktemp -d`), if one does: the controller, run as the `iadeep` account from this
    checkout, must read its shipped data (iadeep_cli/data) as an installation in /opt would
    let it."""
    data = ROOT / "iadeep_cli" / "data" / "h200" / "profiles.csv"
    if not data.stat().st_mode & stat.S_IROTH:
        return data
    return next((d for d in data.parents if not d.stat().st_mode & stat.S_IXOTH), None)


@pytest.fixture
def machine():
    missing = [t for t in ("sudo", "visudo", "useradd") if shutil.which(t) is None]
    if missing or not sshd_available():
        pytest.skip(f"needs {', '.join(missing or ['sshd'])} (make sshd installs them)")
    private = _private_checkout()
    if private is not None:
        pytest.skip(f"the controller runs as another account from this checkout, and {private} "
                    "keeps other accounts out (clone it where they may read it, as /opt/iadeep)")
    if MARK.exists():
        _clean()                           # a killed run's
    taken = [str(p) for p in MADE if p.exists()] + [n for n in (CONTROLLER, JOBS) if _exists(n)]
    if taken:
        pytest.skip(f"this machine has an iadeep set-up ({', '.join(taken)}); the test would "
                    "replace it")
    MARK.touch()
    with shared_dir("iadeep-headnode-") as top:
        yield top
        _clean()


def test_the_documented_head_node_checklist_as_written_ends_with_a_job_on_a_trusted_node(machine):
    top = machine
    lines = checklist()
    node = SshdNode("gpu1", "127.0.0.61", top, ".ssh/authorized_keys", own_home=False)
    scripts = top / "scripts"
    scripts.mkdir(mode=0o755)
    script = scripts / "job.sh"
    script.write_text("#!/bin/sh\necho \"on $(hostname) as $(id -un)\"\nsleep 600\n")
    script.chmod(0o755)
    pubkey = ""
    for line in lines:
        if line.startswith(("cp deploy/", "systemctl ", "journalctl ")):
            continue                       # no systemd here: the unit is started below
        if "iadeep nodes trust" in line:
            # the inventory, as the admin edits it after copying the example
            Path("/etc/iadeep/nodes.yaml").write_text(
                "lab:\n  poll_interval: 0.5\n  node_grace: 30\n"
                f"nodes:\n  - name: gpu1\n    host: {node.addr}\n    port: {node.port}\n"
                f"    user: {JOBS}\n    identity_file: ~/.ssh/id_ed25519\n")
            node.start()
            _preload(top, script)
            m = re.fullmatch(r"sudo -u (\S+) sh -lc '(iadeep [^']+)'", line)
            assert m, line
            user, argv = m.group(1), shlex.split(m.group(2))[1:]
            # as older instructions had it: no login shell, so not the controller's settings
            old = _as(user, {"HOME": pwd.getpwnam(user).pw_dir, "PATH": "/usr/bin:/bin"},
                      argv, stdin="y\n")
            assert old[0] == 1 and f"sudo -u iadeep sh -lc '{' '.join(['iadeep', *argv])}'" \
                in old[2], old
            got = _as(user, _login_env(user), argv, stdin="y\n")
            assert got[0] == 0 and "recorded in /var/lib/iadeep/known_hosts" in got[1], got
            assert _completed_nodes(_login_env(user)) == ["gpu1"]   # Tab after `nodes fence`
            continue
        stdin = pubkey if line.startswith("cat >>") else None
        done = subprocess.run(["sh", "-c", line], cwd=ROOT, input=stdin, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, (line, done.stderr)
        if line.startswith("cat /var/lib/iadeep/.ssh/id_ed25519.pub"):
            pubkey = done.stdout
    assert pubkey.startswith("ssh-ed25519 ")
    assert subprocess.run(["visudo", "-cq"]).returncode == 0      # the sudoers step is valid

    # the unit, as systemd would start it (HOME is the User's home)
    user, env, argv = _unit()
    env = {**env, "HOME": pwd.getpwnam(user).pw_dir, "USER": user, "PATH": "/usr/bin:/bin"}
    log = top / "controller.log"
    log.touch()
    os.chown(log, pwd.getpwnam(user).pw_uid, -1)
    pid = _as(user, env, argv, log=log, wait=False)
    try:
        ensure_user(MEMBER)
        member = _login_env(MEMBER)
        assert member["IADEEP_HOME"] == "/var/lib/iadeep"
        # Tab after `nodes ` offers the nodes to a member too, as the member (their login's
        # settings, their file permissions), not only to the controller's account
        assert run_as(MEMBER, _completed_nodes, member) == ["gpu1"]
        def up() -> bool:
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), log.read_text()[-3000:]
            return os.path.exists("/var/lib/iadeep/controller.sock")
        wait_until(up, limit=120)
        added = _as(MEMBER, member, ["queue", "add", str(script)])
        assert added[0] == 0, (added, log.read_text()[-3000:])
        job = added[1].strip()

        def running():
            _rc, out, _ = _as(MEMBER, member, ["queue", "list"])
            row = next((r for r in out.splitlines()[1:] if r.split()[0] == job), "")
            return "running" in row and "gpu1" in row
        try:
            wait_until(running, limit=120, every=0.5)
        except AssertionError:
            why = _as(MEMBER, member, ["queue", "why", job])
            raise AssertionError(f"job {job} not running: {why}") from None
        assert "unknown host key" not in log.read_text()
        cancel = _as(MEMBER, member, ["queue", "cancel", job])
        assert cancel[0] == 0, cancel
        wait_until(lambda: "cancelled" in _as(MEMBER, member, ["queue", "list", "--all"])[1],
                   limit=120, every=0.5)
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        print(log.read_text()[-4000:] if log.exists() else "no controller log")
        node.stop()
        with accounts_lock():
            subprocess.run(["userdel", MEMBER], capture_output=True)

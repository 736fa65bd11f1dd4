"""A ``run_as: submitter`` lab with real parts (needs root): OS accounts with their own homes,
one group for the lab's members, the sudoers line exactly as docs/security.md gives it, an sshd
node logged into as the controller's unprivileged SSH account, and a real controller.

Used by the tests of running jobs as their submitters (test_runas_sshd.py) and of what such a
job can do to its own files (test_job_files_sshd.py). They change /etc/passwd, /etc/group,
/etc/sudoers.d and /home: mark them ``os_global``.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.accounts import accounts_lock, ensure_user
from helpers.controllers import ControllerProcess
from helpers.sshd import SshdNode, _keygen, sshd_available

ROOT = Path(__file__).resolve().parents[2]


def docs_sudoers_line() -> str:
    """The sudoers line exactly as docs/security.md gives it."""
    found = re.findall(r"^ *(\S+ ALL=\(%\S+,!root\) NOPASSWD: /bin/sh)$",
                       (ROOT / "docs" / "security.md").read_text(), re.M)
    assert len(found) == 1, found
    return found[0]


def account(name: str, shell: str = "/usr/sbin/nologin") -> Path:
    """A real account with its own home directory (0700, its own, emptied of an earlier run's
    job directories and files); no password, but not locked ('*', not '!': sshd without PAM
    refuses a locked account even a key login)."""
    ensure_user(name)
    home = Path(f"/home/{name}")
    with accounts_lock():
        subprocess.run(["usermod", "-d", str(home), "-s", shell, "-p", "*", name], check=True)
    home.mkdir(parents=True, exist_ok=True)
    for left in home.iterdir():
        shutil.rmtree(left) if left.is_dir() and not left.is_symlink() else left.unlink()
    entry = pwd.getpwnam(name)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    os.chmod(home, 0o700)
    return home


def need_tools(*extra: str) -> None:
    """Skip without sudo, visudo, sshd (and the ``extra`` paths); in CI, fail instead."""
    missing = [t for t in ("sudo", "visudo") if shutil.which(t) is None]
    if not sshd_available():
        missing.append("sshd")
    missing += [path for path in extra if not os.path.exists(path)]
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{missing} missing; CI must install sudo and openssh-server (make sshd)")
        pytest.skip(f"needs {', '.join(missing)} (make sshd installs them)")


def install_sudoers(path: Path, line: str) -> None:
    """``line`` as the sudoers file ``path``, checked by visudo before it is put in place."""
    tmp = path.with_name(f".{path.name}.tmp")   # sudo ignores names with a '.'
    tmp.write_text(line + "\n")
    os.chmod(tmp, 0o440)
    subprocess.run(["visudo", "-cq", "-f", str(tmp)], check=True)
    tmp.replace(path)
    subprocess.run(["visudo", "-cq"], check=True)


@dataclass(frozen=True)
class RunAsLab:
    """Names of one test module's lab: ``iadeep-<tag>-ctl`` (the controller's SSH account),
    the members ``iadeep-<tag>-<member>`` in group ``iadeep-<tag>-lab``, and its sudoers file."""

    tag: str
    members: tuple[str, ...] = ("alice", "bob")

    @property
    def ctl(self) -> str:
        return f"iadeep-{self.tag}-ctl"

    @property
    def group(self) -> str:
        return f"iadeep-{self.tag}-lab"

    @property
    def users(self) -> tuple[str, ...]:
        return tuple(f"iadeep-{self.tag}-{m}" for m in self.members)

    @property
    def sudoers(self) -> Path:
        return Path(f"/etc/sudoers.d/iadeep-{self.tag}-test")

    @contextlib.contextmanager
    def running(self, node_name: str, addr: str, lab_yaml: str,
                fake_gpus: int | None = None,
                clean: Callable[[str], None] | None = None) -> Iterator[ControllerProcess]:
        """The accounts, the sudoers line (the docs' one, for this lab's names), an sshd node
        ``node_name`` on ``addr`` (``fake_gpus``: that many stand-in GPUs), and a controller
        whose inventory's ``lab:`` section is ``lab_yaml`` plus ``allowed_group`` and whose one
        node runs jobs as their submitters. ``clean(user)`` (e.g. end a failed run's jobs):
        for every account before it is set up, and for the members once the controller has
        stopped. Yields the controller, with ``node``, ``scripts`` (a directory every account
        can read) and ``top`` (the lab's directory) set on it."""
        for user in (self.ctl, *self.users) if clean is not None else ():
            ensure_user(user)
            clean(user)
        ctl_home = account(self.ctl, shell="/bin/sh")
        with accounts_lock():
            subprocess.run(["groupadd", "-f", self.group], check=True)
        for user in self.users:
            account(user)
            with accounts_lock():
                subprocess.run(["usermod", "-aG", self.group, user], check=True)
        install_sudoers(self.sudoers, docs_sudoers_line().replace(
            "iadeep ", f"{self.ctl} ", 1).replace("%gpu-lab", f"%{self.group}"))
        top = Path(tempfile.mkdtemp(prefix=f"iadeep-{self.tag}-", dir="/tmp"))
        os.chmod(top, 0o755)   # the node's files (sshd reads authorized_keys as the SSH account)
        key = top / "client" / "id_ed25519"
        key.parent.mkdir(mode=0o700)
        _keygen(key)
        authorized = top / "authorized_keys"
        shutil.copy(str(key) + ".pub", authorized)
        os.chmod(authorized, 0o644)
        node = SshdNode(node_name, addr, top, authorized)
        if fake_gpus is not None:
            node.set_fake(gpus=fake_gpus)
        node.start()
        state = top / "state"
        state.mkdir()
        (state / "known_hosts").write_text(node.known_hosts_line() + "\n")
        inventory = top / "nodes.yaml"
        inventory.write_text(
            f"lab:\n{lab_yaml}  allowed_group: {self.group}\n"
            f"nodes:\n  - name: {node_name}\n    host: {node.addr}\n    port: {node.port}\n"
            f"    user: {self.ctl}\n    identity_file: {key}\n    workdir: {ctl_home}/iadeep\n"
            f"    run_as: submitter\n")
        scripts = top / "scripts"
        scripts.mkdir()
        os.chmod(scripts, 0o755)   # (mkdir's mode is cut by the umask)
        ctl = ControllerProcess(state, inventory).start()
        ctl.node, ctl.scripts, ctl.top = node, scripts, top
        try:
            yield ctl
        finally:
            ctl.stop()
            print(ctl.log.read_text()[-4000:])   # shown when a test failed
            if clean is not None:
                for user in self.users:
                    clean(user)
            node.stop()
            self.sudoers.unlink(missing_ok=True)
            shutil.rmtree(top, ignore_errors=True)

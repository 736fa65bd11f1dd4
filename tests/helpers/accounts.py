"""Real second OS accounts (needs root): create one, run code as it in a forked process.

The interpreter lives under /root here, which other accounts cannot open, so code runs as
another account by forking this (already loaded) process and dropping to the account's uid;
``cli_as`` runs the real CLI's ``main()`` that way.
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

# One lock for every change to /etc/passwd and /etc/group made by the tests: parallel workers
# (pytest-xdist) may create the same account at once (the second useradd fails: "already
# exists"), and shadow's tools give up at once on a passwd file another of them holds ("cannot
# lock /etc/passwd; try again later"). A fixed path on purpose: it is the one thing all workers
# must share.
LOCK = Path("/run/lock/iadeep-tests-accounts.lock")

ALICE, BOB = "iadeep-alice", "iadeep-bob"   # the two members most tests act as

# A test that creates accounts runs as root (CI does); elsewhere it skips.
needs_root = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="creating OS accounts needs root (CI runs as root)")
# The marks of a module whose every test creates accounts (one at a time: ``os_global``).
ACCOUNT_TESTS = [pytest.mark.os_global, needs_root]


@contextlib.contextmanager
def shared_dir(prefix: str) -> Iterator[Path]:
    """A fresh folder under /tmp that the other accounts can reach (pytest's tmp_path is
    private to root): for a controller's socket and the scripts members submit."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def submitted(result: dict) -> int:
    """The job id a successful ``queue add`` (a ``cli_as``/``cli_here`` result) printed."""
    assert result["rc"] == 0, result
    return int(result["out"].strip())


def sh_script(folder: Path, name: str, body: str) -> str:
    """An executable ``#!/bin/sh`` script ``folder/name`` running ``body``; its path."""
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@contextlib.contextmanager
def accounts_lock():
    """Hold the tests' account lock (``useradd``, ``usermod``, ``groupadd``, ``userdel``)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_user(name: str) -> int:
    with accounts_lock():
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                            name], check=True)
            return pwd.getpwnam(name).pw_uid


class InChild:
    """``fn(*args)`` in a forked child running as ``uid``/``gid`` (no other groups); ``result()``
    waits for its JSON-able return value (an exception in the child fails the test with its
    traceback). The child never returns into pytest."""

    def __init__(self, uid: int, gid: int, fn, *args):
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read_fd)
            try:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                out = {"ok": fn(*args)}
            except BaseException:
                out = {"failed": traceback.format_exc()}
            try:
                os.write(write_fd, json.dumps(out).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        self._read_fd = read_fd

    def result(self):
        data = b""
        while chunk := os.read(self._read_fd, 65536):
            data += chunk
        os.close(self._read_fd)
        os.waitpid(self.pid, 0)
        out = json.loads(data)
        if "failed" in out:
            raise AssertionError(f"in the child process:\n{out['failed']}")
        return out["ok"]


class AsUser(InChild):
    """``fn(*args)`` as the account ``user`` (made if missing), in a child process."""

    def __init__(self, user: str, fn, *args):
        uid = ensure_user(user)
        super().__init__(uid, pwd.getpwnam(user).pw_gid, fn, *args)


def run_as(user: str, fn, *args):
    return AsUser(user, fn, *args).result()


def cli_here(home: Path | str, *argv: str) -> dict:
    """The real CLI in this process (as whatever account it runs as): rc, stdout, stderr."""
    from iadeep_cli.cli.main import main

    saved = sys.argv, os.environ.get("IADEEP_HOME")
    os.environ["IADEEP_HOME"] = str(home)
    sys.argv = ["iadeep", *argv]
    out, err = io.StringIO(), io.StringIO()
    rc = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved[0]
        if saved[1] is None:
            del os.environ["IADEEP_HOME"]
        else:
            os.environ["IADEEP_HOME"] = saved[1]
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}


def warm_cli(*argv: str) -> None:
    """Run ``iadeep ARGV`` once here against an empty state directory (no controller there,
    so nothing happens), so that what the command imports lazily is loaded before a fork:
    other accounts cannot read the interpreter's files under /root."""
    with tempfile.TemporaryDirectory() as empty:
        cli_here(empty, *argv)


def cli_as(user: str, home: Path | str, *argv: str) -> dict:
    warm_cli(*argv)
    return run_as(user, cli_here, str(home), *argv)


def unused_uid() -> int:
    """A uid no account has (as a deleted user's still-running process has)."""
    for uid in range(4_200_000, 4_300_000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no unused uid in 4200000-4299999")


def cli_as_uid(uid: int, home: Path | str, *argv: str) -> dict:
    """The real CLI as a uid that has no account (a deleted user's process lives on)."""
    warm_cli(*argv)
    return InChild(uid, uid, cli_here, str(home), *argv).result()

"""The test nodes' stand-in nvidia-smi (tests/helpers/sshd.py) answers for every account a
node's SSH account may be, also when the checkout lies under a private directory: a clone in a
0700 home or a ``mktemp -d`` must pass ``make test``, and the run_as tests log into their nodes
as other OS accounts, which cannot enter such a directory.

The layout is made for real: the parts of a checkout the helper uses (tests/helpers/sshd.py,
tests/fakes, tests/fixtures/nvidia-smi) copied under a 0700 directory, the copy's ``SshdNode``
set up in a world-readable directory as the labs' nodes are, and what its sshd would put first
on PATH run as another account.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from helpers.accounts import shared_dir
from helpers.sshd import sshd_available

TESTS = Path(__file__).resolve().parents[1]
OTHER = "nobody"   # an account that exists on every Debian-like system; nothing is changed


@pytest.fixture
def private_clone(tmp_path) -> ModuleType:
    """The sshd helper as loaded from a checkout under a 0700 directory."""
    private = tmp_path / "private"
    private.mkdir()
    private.chmod(0o700)
    clone = private / "iadeep"
    (clone / "tests" / "helpers").mkdir(parents=True)
    shutil.copy(TESTS / "helpers" / "sshd.py", clone / "tests" / "helpers" / "sshd.py")
    shutil.copytree(TESTS / "fakes", clone / "tests" / "fakes")
    shutil.copytree(TESTS / "fixtures" / "nvidia-smi", clone / "tests" / "fixtures" / "nvidia-smi")
    spec = importlib.util.spec_from_file_location("private_clone_sshd",
                                                  clone / "tests" / "helpers" / "sshd.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert Path(module.FAKES).is_relative_to(private)   # the clone's own stand-in
    return module


@pytest.fixture
def node_root() -> Iterator[Path]:
    """Where a lab puts its nodes (as helpers/runas_lab.py does: 0755 under /tmp; pytest's
    own tmp_path is 0700)."""
    with shared_dir("iadeep-standin-") as top:
        yield top


def _session_env(node) -> dict[str, str]:
    """PATH and FAKE_SMI_STATE as the node's sshd gives every session (its SetEnv line)."""
    line = next(x for x in node.config.read_text().splitlines() if x.startswith("SetEnv "))
    return dict(item.split("=", 1) for item in line.split()[1:])


def _not_for_others(path: Path) -> list[str]:
    """What keeps an account that is neither owner nor group from executing ``path``."""
    out = [f"{d} ({stat.filemode(d.stat().st_mode)})" for d in path.parents
           if not d.stat().st_mode & stat.S_IXOTH]
    mode = path.stat().st_mode
    if mode & (stat.S_IROTH | stat.S_IXOTH) != stat.S_IROTH | stat.S_IXOTH:
        out.append(f"{path} ({stat.filemode(mode)})")
    return out


def _smi_list(env: dict[str, str]) -> dict:
    """Runs as the other account: `nvidia-smi -L` through a shell with a node session's
    environment, as the node's sshd runs a command."""
    done = subprocess.run(["/bin/sh", "-c", "nvidia-smi -L"], env=env, capture_output=True,
                          text=True, timeout=30, cwd="/")
    return {"rc": done.returncode, "out": done.stdout, "err": done.stderr}


def test_the_standin_on_a_nodes_path_is_open_to_every_account_from_a_private_clone(
        private_clone, node_root):
    if shutil.which("ssh-keygen") is None:
        pytest.skip("needs ssh-keygen (make sshd installs it)")
    node = private_clone.SshdNode("n1", "127.0.0.2", node_root, node_root / "authorized_keys")
    first = Path(_session_env(node)["PATH"].split(":")[0])
    smi = first / "nvidia-smi"
    assert smi.is_file(), smi
    blocked = _not_for_others(smi)
    assert not blocked, f"{smi} is out of other accounts' reach: {blocked}"
    for f in (smi.parent.parent / "fixtures" / "nvidia-smi").iterdir():   # what it replays
        assert f.stat().st_mode & stat.S_IROTH, f


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another account needs root")
def test_another_account_runs_the_standin_from_a_private_clone(private_clone, node_root):
    """What failed in a clone under a 0700 directory: the node's SSH account, another OS
    account, could not execute `nvidia-smi` ("Permission denied"), so every poll failed."""
    from helpers.accounts import run_as

    if not sshd_available():
        pytest.skip("needs Debian's openssh-server (make sshd installs it)")
    node = private_clone.SshdNode("n1", "127.0.0.2", node_root, node_root / "authorized_keys")
    got = run_as(OTHER, _smi_list, _session_env(node))
    assert got == {"rc": 0, "out": (TESTS / "fixtures" / "nvidia-smi" /
                                    "h200-idle-list.txt").read_text(), "err": ""}, got

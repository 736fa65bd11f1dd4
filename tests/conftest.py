"""Shared fixtures, and the suite's three parts as markers.

``tests/unit`` (marker ``unit``): no sshd nodes, no controller: ``pytest -m unit``, a minute.
``tests/integration`` (``integration``): real sshd nodes, controller processes, real accounts.
``tests/tui`` (``tui``): the monitor rendered by Textual.  Helpers are the ``tests/helpers``
package (``pythonpath = tests`` in pyproject.toml).

``sshd_cluster(n)`` gives real OpenSSH servers on 127.0.0.x (see tests/helpers/sshd.py).

In parallel (``make test``: pytest-xdist, ``-n N --dist loadgroup``) each worker is its own
process with its own session fixtures (its own sshd nodes, keys and ports, its own basetemp
``popen-gwN``), so what a test must not share is what the machine shares: see
``pytest_collection_modifyitems`` and the ``os_global`` marker.

sshd start-up costs ~0.1 s per node, so clusters are cached for the whole session by
(n, key); each test gets HOME and IADEEP_HOME pointed at the cluster's directories (monkeypatch)
and the nodes reset to running + default stand-in behaviour.  A test that damages a cluster in a
way ``reset`` cannot undo (e.g. a new host key) asks for its own ``key``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.sshd import Cluster, sshd_available

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PARTS = ("unit", "integration", "tui")


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist reads the xdist_group markers
def pytest_collection_modifyitems(items):
    """Each test gets the marker of the folder it lives in; an ``os_global`` test (one that
    changes what the whole machine shares: accounts, sudoers, mounts, system daemons) joins the
    xdist group "os_global", so that under ``-n N --dist loadgroup`` they all run in one
    worker, one after another, never beside each other."""
    for item in items:
        part = item.path.parent.name
        if part in PARTS:
            item.add_marker(getattr(pytest.mark, part))
        if item.get_closest_marker("os_global") is not None:
            item.add_marker(pytest.mark.xdist_group("os_global"))


def _need_sshd() -> None:
    if sshd_available():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("/usr/sbin/sshd or ssh-keygen is missing; CI must install openssh-server")
    pytest.skip("needs Debian's openssh-server (/usr/sbin/sshd) to start test nodes")


@pytest.fixture(scope="session")
def _sshd_clusters(tmp_path_factory):
    clusters: dict[tuple, Cluster] = {}

    def get(n: int, key: str) -> Cluster:
        if (n, key) not in clusters:
            _need_sshd()
            clusters[(n, key)] = Cluster(tmp_path_factory.mktemp(f"sshd-{key}-{n}"), n)
        return clusters[(n, key)]

    yield get
    for c in clusters.values():
        c.shutdown()


@pytest.fixture
def sshd_cluster(_sshd_clusters, monkeypatch):
    """Factory: ``sshd_cluster(n=2, key="default") -> Cluster`` (running, HOME pointed at it)."""

    def make(n: int = 2, key: str = "default") -> Cluster:
        cluster = _sshd_clusters(n, key)
        cluster.reset()
        monkeypatch.setenv("HOME", str(cluster.home))
        monkeypatch.setenv("IADEEP_HOME", str(cluster.home / "state"))
        monkeypatch.delenv("IADEEP_INVENTORY", raising=False)
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        return cluster

    return make


@pytest.fixture
def smi_fixture():
    """Read a real nvidia-smi output file by name."""
    return lambda name: (FIXTURES / "nvidia-smi" / name).read_text()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh, empty iadeep state directory ($IADEEP_HOME) for this test."""
    monkeypatch.setenv("IADEEP_HOME", str(tmp_path))
    return tmp_path

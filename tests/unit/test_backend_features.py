"""The controller decides by what a backend declares (``nodes/backend.FEATURES``), never by
which backend a node has: each backend's own flags are its row of that table, and every kind
has a row."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from iadeep_cli.nodes.backend import FEATURES, features
from iadeep_cli.nodes.shell.backend import ShellBackend
from iadeep_cli.nodes.slurm.backend import SlurmBackend
from iadeep_cli.settings import BackendKind

FLAGS = ("keeps_jobs_pending", "progress_in_poll", "job_dirs", "interactive")
CONTROLLER = Path(__file__).resolve().parents[2] / "iadeep_cli" / "controller"


def test_every_kind_of_backend_has_its_features():
    assert set(FEATURES) == set(BackendKind)
    assert features("slurm") is FEATURES[BackendKind.SLURM]


@pytest.mark.parametrize("backend", [ShellBackend, SlurmBackend])
def test_a_backends_own_flags_are_its_kinds_features(backend):
    row = FEATURES[backend.kind]
    assert {f: getattr(backend, f) for f in FLAGS} == {f: getattr(row, f) for f in FLAGS}


def test_the_controller_never_asks_which_backend_a_node_has():
    """docs/backends.md: a third backend needs no controller change."""
    found = [f"{path.relative_to(CONTROLLER)}:{n}: {line.strip()}"
             for path in sorted(CONTROLLER.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r'"slurm"|BackendKind\.|"ssh"', line)]
    assert not found, "\n".join(found)

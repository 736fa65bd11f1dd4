"""Fixtures shared by the integration tests that drive the real `iadeep` command against a
real controller process with no nodes (test_queue_cli, test_cli_messages,
test_deps_arrays_cli): with no node, every job stays queued, so what is listed is stable."""
from __future__ import annotations

import pytest

from helpers.controllers import controller_on

# the Slurm backend's fixtures (test_slurm_*.py): registered once here, so that every module
# shares the one session Slurm (its daemons listen on fixed ports)
from helpers.slurm import lab, slurm_cluster  # noqa: F401


@pytest.fixture
def script(tmp_path):
    """An executable job script that echoes its arguments."""
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/sh\necho hello \"$@\"\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def controller(tmp_path):
    """A controller with an (explicitly) empty cluster: jobs are accepted and wait."""
    ctl = controller_on(tmp_path)
    yield ctl
    ctl.stop()

"""A controller's own machine as its one node (``local: true``), its GPUs replayed by the fake
NVML library in tests/fakes/pynvml: the environment and inventory for a real controller
process, shared by the end-to-end tests of local nodes and of ``iadeep report``."""
from __future__ import annotations

import os
from pathlib import Path

FAKE_PYNVML = Path(__file__).resolve().parents[1] / "fakes" / "pynvml"


def local_lab(monkeypatch, inventory: Path, workdir: Path, gpus: int = 2) -> Path:
    """Point child processes (the controller) at the fake pynvml with ``gpus`` idle GPUs that
    see only jobs under ``workdir`` (not another test's, nor another pytest-xdist worker's),
    and write ``inventory``: the local node ``here`` polled every 0.3 s. Returns ``inventory``."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(FAKE_PYNVML), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("FAKE_NVML_MODE", "idle")
    monkeypatch.setenv("FAKE_NVML_GPUS", str(gpus))
    monkeypatch.setenv("FAKE_NVML_JOBS_UNDER", str(workdir))
    inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 10\n"
                         f"nodes:\n  - name: here\n    local: true\n    workdir: {workdir}\n")
    return inventory

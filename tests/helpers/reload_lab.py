"""A real controller whose inventory a test rewrites while jobs run (`controller reload`,
SIGHUP), over real sshd nodes with one stand-in GPU each: the lab's settings, a job that runs
until it is stopped, and the start every such test shares."""
from __future__ import annotations

from pathlib import Path

from helpers.controllers import ControllerProcess, jobs_by_id

ROOT = Path(__file__).resolve().parents[2]
LAB = "lab:\n  poll_interval: 0.3\n  node_grace: 3\n"
# a job that runs until it is stopped, alone on its GPU
LONG_JOB = [str(ROOT / "jobs/steps_progress.sh"), "6000", "0.1", "--exclusive"]


def job_row(home: Path, job_id: int) -> dict:
    """One job as `queue list --json` shows it."""
    return jobs_by_id(home)[job_id]


def start(cluster, tmp_path: Path, listed: list[str] | None = None
          ) -> tuple[Path, ControllerProcess]:
    """Every node of ``cluster`` given one GPU, an inventory (``tmp_path/nodes.yaml``) of the
    ``listed`` ones (None: all), and a controller started on it: (the inventory, the
    controller)."""
    for node in cluster.nodes.values():
        node.set_fake(gpus=1)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text(LAB + cluster.inventory_yaml(listed))
    return inventory, ControllerProcess(tmp_path / "state", inventory).start()

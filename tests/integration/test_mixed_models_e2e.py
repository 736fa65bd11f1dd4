"""Mixed GPU models end to end: two real sshd nodes whose stand-in nvidia-smi replays the real
H200 output, one of them with the name field rewritten to an A100's, and a real controller.

The lab measured two workloads solo on both models (profiles in the controller's database, as
profiling on each model would have left them): "dense" runs at 0.40x on the A100, "light" at
0.95x. With both nodes empty, a dense job goes to the H200 node although the A100 node comes
first by name (a placement blind to the model takes it: the same plan() without the speed
table, checked below on the same slots), and `queue why` says which model and why.
"""
from __future__ import annotations

import json
import time

import pytest

from helpers.controllers import cli, jobs_by_id, queue_add, start_lab, wait_until
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.paths import StateDir
from iadeep_cli.profiles import Profile
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, plan
from iadeep_cli.settings import Policy
from iadeep_cli.sim.truth import TruthModel
from iadeep_cli.store import Store, profiles as profrows

H200, A100 = "NVIDIA H200", "NVIDIA A100-SXM4-80GB"


def _profiles(home) -> None:
    home.mkdir(parents=True, exist_ok=True)
    store = Store(StateDir(home).db)
    now = time.time()
    with store.tx() as c:
        for workload, h200, a100 in (("dense", 50.0, 20.0), ("light", 400.0, 380.0)):
            for model, it_s in ((H200, h200), (A100, a100)):
                profrows.upsert_profile(c, Profile(workload, 90.0, 40.0, 2.0, gpu_model=model,
                                                   solo_it_per_s=it_s), now)
    store.close()


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    old, new = cluster.nodes["node01"], cluster.nodes["node02"]
    old.set_fake(gpus=1, name=A100)    # first by name: where a model-blind placement goes
    new.set_fake(gpus=1)               # the real output as it is: an H200
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 30\n"
                         + cluster.inventory_yaml())
    _profiles(tmp_path / "state")
    ctl = start_lab(cluster, tmp_path, inventory)
    yield ctl
    ctl.stop()


def test_a_job_goes_to_the_gpu_model_where_it_gains_most(lab, tmp_path):
    home = lab.home
    names = wait_until(lambda: _gpu_names(home), 60)
    assert names == {"node01": [A100], "node02": [H200]}
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    script.chmod(0o755)
    job = queue_add(home, str(script), "--workload", "dense")
    wait_until(lambda: jobs_by_id(home)[job]["state"] in ("starting", "running"), 60)
    assert jobs_by_id(home)[job]["node"] == "node02"
    note = "h200 runs dense at 2.50x its a100 speed (measured on both a100 and h200)"
    wait_until(lambda: jobs_by_id(home)[job]["state"] == "running", 60)
    why = cli(home, "queue", "why", str(job), check=True).stdout.splitlines()
    assert why[0].startswith("job 1 is running: running on node02:0") and why[0].endswith(
        f"; {note}"), why
    assert why[1].startswith("expected run time ~"), why   # placement's estimate
    events = json.loads(cli(home, "queue", "show", str(job), "--json", check=True).stdout
                        )["events"]
    assert any(e["reason"] == f"placed on node02:0; {note}" for e in events), events
    cli(home, "queue", "cancel", str(job), check=True)

    # The same slots without the speed table: plan() goes to node01 (first by name).
    slots = [GpuSlot("node01", 0, 143771.0, 143156.0, gpu_model="a100"),
             GpuSlot("node02", 0, 143771.0, 143156.0, gpu_model="h200")]
    q = [Job(1, "u", JobSpec("/s", workload="dense"), JobState.QUEUED, 0.0)]
    prof = {"dense": Profile("dense", 90.0, 40.0, 2.0, gpu_model=H200, solo_it_per_s=50.0)}
    blind = plan(q, slots, [], 0.0,
                 PlanInputs(prof, TruthModel([]), Policy()))
    assert blind.placements[0].node == "node01"


def _gpu_names(home) -> dict | None:
    """Each node's GPU names as `iadeep status --json` shows them, once both answered."""
    out = cli(home, "status", "--json")
    if out.returncode != 0:
        return None
    nodes = json.loads(out.stdout)["nodes"]
    names = {n["name"]: [g["name"] for g in n["gpus"]] for n in nodes}
    return names if len(names) == 2 and all(names.values()) else None

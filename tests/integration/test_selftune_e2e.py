"""Self-tuning end to end: real sshd nodes, a real controller process, the CLI.

The lab's database starts with a tuning record saying an earlier replay adopted one job per GPU
(through the store API): two light jobs run one after the other. Then two days of history on
its one GPU are added, also through the store API: light jobs (mlp, resnet18, lstm) arriving
faster than one GPU serves them one at a time. Replaying that history, three jobs per GPU cuts
the average JCT several times over, so the controller adopts it after two replays in a row and
places two new jobs on the GPU together; `iadeep tune` shows the table and why. Pinning
``max_jobs_per_gpu: 1`` in nodes.yaml (and a reload) puts one job per GPU back in force at
once, and a later replay weighs only settings that keep it.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

from helpers.controllers import cli, queue_add, start_lab, wait_jobs, wait_until

ROOT = Path(__file__).resolve().parents[2]
STEPS = str(ROOT / "jobs/steps_progress.sh")
LIGHT = ("mlp", "resnet18", "lstm")


def _inventory(cluster, path: Path, policy: str) -> Path:
    cluster.nodes["node01"].set_fake(gpus=1)
    path.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 3\n  policy:\n"
                    f"    tune_every: 1\n{policy}" + cluster.inventory_yaml(["node01"]))
    return path


def _adopted_one_per_gpu(db: Path, now: float) -> None:
    """An earlier replay's adoption of one job per GPU."""
    from iadeep_cli.store import Store, cluster

    store = Store(db)
    with store.tx() as conn:
        cluster.set_meta(conn, "tune", {"at": now - 86400, "adopted": {
            "max_jobs_per_gpu": 1, "min_speed": 0.3, "sharing": "threshold"}})
    store.close()


def _seed(db: Path, now: float) -> None:
    """60 finished jobs of the last two days on node01's GPU, one at a time (as exclusive
    ran them)."""
    from iadeep_cli.jobs import JobSpec
    from iadeep_cli.store import Store, jobrows

    rng = random.Random(7)
    store = Store(db)
    t, free = now - 2 * 86400, now - 2 * 86400
    with store.tx() as conn:
        for i in range(60):
            t += rng.expovariate(1 / 1200.0)   # one every 20 min; each runs ~30 min alone
            run = min(4 * 3600.0, max(300.0, rng.lognormvariate(7.5, 0.8)))
            spec = JobSpec(script="/bin/true", workload=LIGHT[i % 3], name=f"old{i}")
            job_id, _ = jobrows.insert(conn, "alice", spec, t)
            start = max(t, free)
            free = start + run
            jobrows.update(conn, job_id, state="succeeded", started_at=start, ended_at=free,
                           node="node01", gpu_indices=(0,), exit_code=0)
    store.close()


def _record(home: Path) -> dict:
    from iadeep_cli.store import Store, cluster

    store = Store(home / "iadeep.db", readonly=True)
    try:
        with store.read() as conn:
            return cluster.get_meta(conn, "tune", {}) or {}
    finally:
        store.close()


def test_history_favouring_three_per_gpu_is_adopted_and_a_pin_stops_it(sshd_cluster,
                                                                       tmp_path):
    cluster = sshd_cluster(2)
    home = tmp_path / "state"
    home.mkdir()
    _adopted_one_per_gpu(home / "iadeep.db", time.time())
    inventory = _inventory(cluster, tmp_path / "nodes.yaml", "")
    ctl = start_lab(cluster, tmp_path, inventory)
    try:
        _one_after_the_other(home, "before")   # the earlier adoption is in force
        _seed(home / "iadeep.db", time.time())   # the history: while it runs
        # two replays in a row agree: three jobs per GPU adopted
        rec = wait_until(lambda: (r := _record(home)).get("adopted", {}).get(
            "max_jobs_per_gpu") == 3 and r, limit=300)
        assert "cuts the average JCT" in rec["history"][-1]["why"]
        assert rec["table"]["jobs"] == 62   # the history and the two jobs just run
        shown = cli(home, "tune", check=True).stdout
        assert "In force: 3/GPU" in shown, shown
        assert "1/GPU (exclusive)" in shown and "best" in shown
        assert "Adopted" in shown
        # ... and placement uses it: two light jobs share the one GPU
        ids = [queue_add(home, STEPS, "400", "0.2", "--workload", "mlp", "--name", f"new{i}")
               for i in range(2)]
        wait_jobs(home, lambda js: all(js[i]["state"] == "running" for i in ids))
        for i in ids:
            cli(home, "queue", "cancel", str(i), check=True)
        wait_jobs(home, lambda js: all(js[i]["state"] == "cancelled" for i in ids))

        # pinned in nodes.yaml: one job per GPU again, at once and for good
        _inventory(cluster, inventory, "    max_jobs_per_gpu: 1\n")
        cli(home, "controller", "reload", check=True)
        _one_after_the_other(home, "pinned")
        # the first replay begun after the pin (the table says what it took as pinned: one in
        # flight at the reload, or the adopting one, did not) weighs only settings that keep
        # it, so no streak can form
        rec = wait_until(lambda: "max_jobs_per_gpu" in (r := _record(home))["table"].get(
            "pinned", ()) and r, limit=300)
        assert rec["table"]["in_force"]["max_jobs_per_gpu"] == 1
        assert {o["settings"]["max_jobs_per_gpu"] for o in rec["table"]["outcomes"]} == {1}
        assert rec["proposal"] is None
        shown = json.loads(cli(home, "tune", "--json", check=True).stdout)
        assert shown["in_force"]["max_jobs_per_gpu"] == 1 and shown["would_pick"] is None
        assert shown["pinned"] == ["max_jobs_per_gpu"]
    finally:
        ctl.stop()


def _one_after_the_other(home: Path, name: str) -> None:
    """Two light jobs on the lab's one GPU run one after the other (one job per GPU)."""
    ids = [queue_add(home, STEPS, "40", "0.1", "--workload", "mlp", "--name", f"{name}{i}")
           for i in range(2)]
    jobs = wait_jobs(home, lambda js: all(js[i]["state"] == "succeeded" for i in ids))
    first, second = sorted((jobs[i] for i in ids), key=lambda j: j["started_at"])
    assert second["started_at"] >= first["ended_at"], (first, second)


"""Co-location rows are one member's word until another member's jobs agree (issue 41, item 2):
real OS accounts (iadeep-alice, iadeep-bob) whose identity the controller takes from the
socket, a real sshd node with one stand-in GPU, a real controller process and the real CLI.

- alice's job prints PyTorch's out-of-memory line beside her own job: the pair is held as
  alice's. The model fitted on the lab's rows (what the refit and self-tuning's replay read)
  predicts what it did before; bob's job that failed on that GPU before alice's started is no
  partner of it.
- bob's jobs then say the same of the same pair: it is the lab's, and the model learns it.
- an admin lists the rows and removes them; a member is refused with one line.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from helpers.accounts import ACCOUNT_TESTS, ALICE, BOB, cli_as, sh_script, shared_dir, submitted
from helpers.controllers import ControllerProcess, cli, jobs_by_id, wait_jobs
from iadeep_cli.controller.catalog import lab_measurements
from iadeep_cli.sim import whatif
from iadeep_cli.store import Store

pytestmark = ACCOUNT_TESTS   # creates Unix accounts

OOM_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
            "a total capacity of 139.81 GiB of which 1.25 GiB is free.")


@pytest.fixture
def lab(sshd_cluster):
    with shared_dir("iadeep-coloc-trust-") as top:
        cluster = sshd_cluster(1)
        cluster.nodes["node01"].set_fake(gpus=1)
        inventory = top / "nodes.yaml"
        inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 30\n"
                             + cluster.inventory_yaml())
        home = top / "state"
        home.mkdir(mode=0o700)
        ctl = ControllerProcess(home, inventory).start()
        ctl.top = top
        try:
            yield ctl
        finally:
            ctl.stop()
            cluster.kill_jobs()


def _rows(home: Path) -> list[tuple[str, str, str]]:
    """(workloads, owners, kind) of every co-location row, oldest first."""
    conn = sqlite3.connect(f"file:{home / 'iadeep.db'}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT jobs, owners, kind FROM colocations ORDER BY id").fetchall()
    finally:
        conn.close()


def _learnt(home: Path) -> tuple[list, tuple[float, float]]:
    """(the lab's pairs the refit and the replay fit on, what the replay's model predicts for
    mlp beside mlp)."""
    store = Store(home / "iadeep.db", readonly=True)
    try:
        pairs = lab_measurements(store)[1]
        profiles, _, model = whatif.lab_inputs(store, None, {"mlp"})
    finally:
        store.close()
    p = model.predict_pair(profiles["mlp"], profiles["mlp"])
    return pairs, (round(p.speed_a, 3), round(p.speed_b, 3))


def _oom_beside(lab, user: str, stop: Path) -> tuple[int, int]:
    """``user``'s long mlp job, then their mlp job that shares its GPU and dies of a CUDA
    out-of-memory error; (the long job's id, the dying job's id) once the second failed."""
    top, home = lab.top, lab.home
    partner = submitted(cli_as(user, home, "queue", "add", "--workload", "mlp", str(
        top / "wait.sh"), str(stop)))
    wait_jobs(home, lambda js: js[partner]["state"] == "running")
    dies = submitted(cli_as(user, home, "queue", "add", "--workload", "mlp",
                            str(top / "oom.sh")))
    wait_jobs(home, lambda js: js[dies]["state"] == "failed")
    return partner, dies


def test_one_members_out_of_memory_pairs_are_held_until_another_member_agrees(lab):
    top, home = lab.top, lab.home
    sh_script(top, "wait.sh", "while [ ! -e \"$1\" ]; do sleep 0.1; done")
    sh_script(top, "oom.sh", f"sleep 2\necho '{OOM_LINE}' >&2\nexit 1")
    sh_script(top, "fails.sh", "sleep 1\nexit 1")
    _, alone = _learnt(home)
    # bob's lstm job fails on the GPU; alice's jobs come after it (within 120 s)
    bobs = submitted(cli_as(BOB, home, "queue", "add", "--workload", "lstm",
                            str(top / "fails.sh")))
    wait_jobs(home, lambda js: js[bobs]["state"] == "failed")
    stop_a = top / "stop-a"
    partner_a, dies = _oom_beside(lab, ALICE, stop_a)
    reason = jobs_by_id(home)[dies]["reason"]
    assert reason.startswith("out of GPU memory (exit code 1) while sharing GPU node01:0 with "
                             "job ") and f"job {bobs}" not in reason, reason
    # held as alice's: nothing the model or self-tuning learn from changed
    assert _rows(home) == [('["mlp", "mlp"]', ALICE, "held")]
    assert _learnt(home) == ([], alone) and alone[0] > 0.5
    stop_a.touch()
    # alice's long job recorded as ended before bob's jobs come: still running there, it would
    # be a partner of bob's dying job too (steps/oom.partners), and a third row bob's word
    wait_jobs(home, lambda js: js[partner_a]["state"] == "succeeded")
    # bob's jobs say the same of the pair: agreed, the lab's
    stop_b = top / "stop-b"
    _oom_beside(lab, BOB, stop_b)
    stop_b.touch()
    assert _rows(home) == [('["mlp", "mlp"]', ALICE, "lab"), ('["mlp", "mlp"]', BOB, "lab")]
    pairs, learnt = _learnt(home)
    assert len(pairs) == 2 and max(learnt) < 0.1   # the model learnt the pair is unsafe
    # an admin lists and removes them; a member may do neither
    listed = cli(home, "profile", "pairs", check=True).stdout
    assert "mlp + mlp" in listed and "agreed by jobs of iadeep-bob" in listed
    for args in (("profile", "pairs"), ("profile", "pair-remove", "1")):
        refused = cli_as(BOB, home, *args)
        assert refused["rc"] == 1 and refused["err"].strip().splitlines() == [
            "Error: only a lab admin may list, adopt or remove co-location rows; iadeep-bob "
            "is not one (hint: ask a lab admin (lab.admins in nodes.yaml) or root)"], refused
    removed = cli(home, "profile", "pair-remove", "1", "2", check=True).stdout
    assert removed.strip() == "removed 2 co-location rows: 1, 2"
    assert _rows(home) == [] and _learnt(home) == ([], alone)

"""Reservations end to end: a real controller, a real sshd node with one (stand-in) GPU, and
two real OS accounts whose identity the controller takes from the socket (SO_PEERCRED).

An admin (root) reserves the node's GPU for iadeep-alice from now for 8 h. iadeep-bob's job
then waits, naming the reservation, while alice's job runs on it; once the reservation is
deleted, bob's job runs too.
"""
from __future__ import annotations

import json

import pytest

from helpers.accounts import (
    ACCOUNT_TESTS,
    ALICE,
    BOB,
    cli_as,
    sh_script,
    shared_dir,
    submitted,
)
from helpers.controllers import ControllerProcess, cli, jobs_by_id, wait_until

pytestmark = ACCOUNT_TESTS   # creates Unix accounts


@pytest.fixture
def top():
    with shared_dir("iadeep-reserve-") as path:
        yield path


def test_a_reservation_keeps_others_off_its_gpu_while_its_user_runs_there(sshd_cluster, top):
    cluster = sshd_cluster(1)
    cluster.node("node01").set_fake(gpus=1)
    inventory = top / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 10\n"
                         + cluster.inventory_yaml())
    home = top / "state"
    ctl = ControllerProcess(home, inventory).start()
    try:
        # only admins reserve
        refused = cli_as(BOB, home, "reserve", "add", "--user", BOB, "--duration", "8h")
        assert refused["rc"] == 1 and "only a lab admin may reserve GPUs" in refused["err"]
        made = cli(home, "reserve", "add", "--user", ALICE, "--gpus", "1", "--node", "node01",
                   "--start", "now", "--duration", "8h", check=True).stdout
        assert made.startswith("reservation 1: 1 GPU(s) on node01 for iadeep-alice from ")
        listed = json.loads(cli(home, "reserve", "list", "--json", check=True).stdout)
        assert [(r["id"], r["user"], r["held"]) for r in listed] == [(1, ALICE, ["node01:0"])]

        go = top / "go"
        gated = sh_script(top, "gated.sh", f"while [ ! -e {go} ]; do sleep 0.1; done")
        bobs = submitted(cli_as(BOB, home, "queue", "add", "--exclusive", "--time", "10",
                                sh_script(top, "bob.sh", "echo bob ran")))
        why = wait_until(lambda: (out := cli(home, "queue", "why", str(bobs)).stdout)
                         and "reservation" in out and out, limit=60)
        assert f"job {bobs} is queued:" in why
        assert "node01:0 kept by reservation 1 for iadeep-alice until " in why
        alices = submitted(cli_as(ALICE, home, "queue", "add", "--exclusive", gated))
        wait_until(lambda: jobs_by_id(home)[alices]["state"] == "running", limit=60)
        assert jobs_by_id(home)[bobs]["state"] == "queued"   # still kept off

        # the monitor's data: the GPU says whose reservation holds it
        status = json.loads(cli(home, "status", "--json", check=True).stdout)
        assert status["reservations"][0]["held"] == ["node01:0"]

        go.touch()
        wait_until(lambda: jobs_by_id(home)[alices]["state"] == "succeeded", limit=60)
        deleted = cli(home, "reserve", "delete", "1", check=True).stdout
        assert deleted.startswith("deleted reservation 1 (")
        wait_until(lambda: jobs_by_id(home)[bobs]["state"] == "succeeded", limit=60)
        assert cli(home, "reserve", "list", "--json", check=True).stdout.strip() == "[]"
        again = submitted(cli_as(ALICE, home, "queue", "add", sh_script(top, "a2.sh", "true")))
        wait_until(lambda: jobs_by_id(home)[again]["state"] == "succeeded", limit=60)
    finally:
        ctl.stop()

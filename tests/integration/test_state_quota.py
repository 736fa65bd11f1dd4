"""The state directory's script copies, bounded lab-wide: two members at their own limits must
not fill it together and lock the others out. Real accounts submit through a real controller's
socket; the lab's total (lab.script_copies_gib) is made small so that a few 4 MiB scripts
reach it."""
from __future__ import annotations

import json

import pytest

from helpers.accounts import ACCOUNT_TESTS, ALICE, BOB, cli_as, shared_dir
from helpers.controllers import ControllerProcess, cli

pytestmark = ACCOUNT_TESTS

MIB = 2**20
SIZE = 4 * MIB - 64              # just under the largest script accepted


@pytest.fixture
def lab():
    with shared_dir("iadeep-quota-") as state:   # the accounts reach the socket inside
        inventory = state / "nodes.yaml"
        inventory.write_text(f"lab:\n  script_copies_gib: {12 / 1024}\nnodes: []\n")
        script = state / "big.sh"
        script.write_bytes(b"#!/bin/sh\n" + b"#" * (SIZE - 11) + b"\n")
        script.chmod(0o644)
        ctl = ControllerProcess(state / "home", inventory).start()
        ctl.script = script
        yield ctl
        ctl.stop()


def test_two_members_together_cannot_fill_the_state_directory(lab):
    """Alice keeps two 4 MiB scripts and Bob one (each far under their own 256 MiB): the lab's
    12 MiB is full, so the next script, whoever sends it, is refused in one line that says
    who holds most; nothing of the refused job is kept. (Before, only each member's own 256
    MiB bounded the copies: two members filled a state directory that had 512 MiB free.)"""
    for user in (ALICE, ALICE, BOB):
        out = cli_as(user, lab.home, "queue", "add", str(lab.script))
        assert out["rc"] == 0, out
    jobs = json.loads(cli(lab.home, "queue", "list", "--json", check=True).stdout)
    for user in (BOB, ALICE):
        out = cli_as(user, lab.home, "queue", "add", str(lab.script))
        assert out["rc"] == 1 and len(out["err"].splitlines()) == 1, out
        assert out["err"].startswith(
            "Error: the lab's script copies kept by the controller hold 12.0 MiB of at most "
            f"12 MiB (lab.script_copies_gib; most: {ALICE} 8.0 MiB, {BOB} 4.0 MiB): this "
            "script (4.0 MiB) is refused"), out
    assert json.loads(cli(lab.home, "queue", "list", "--json", check=True).stdout) == jobs
    assert len(list((lab.home / "scripts").iterdir())) == 3

"""Fair share end to end: a real controller, a real sshd node with one (stand-in) GPU, and two
real OS accounts whose identity the controller takes from the socket (SO_PEERCRED).

iadeep-alice ran 100 GPU-hours in the past week (a finished job in the controller's database,
as a previous run of the controller would have left it); iadeep-bob ran nothing. Both queue a
job while the GPU is busy, alice first. With lab.policy.fairshare on, bob's job must start
first, and `queue why` / `queue show --json` must show each part of the priority, matching a
hand computation from the formula in docs/scheduling.md.
"""
from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

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
from helpers.controllers import ControllerProcess, cli, jobs_by_id, queue_add, wait_until
from iadeep_cli.jobs import JobSpec, JobState
from iadeep_cli.paths import StateDir
from iadeep_cli.store import Store, jobrows

H, WEEK = 3600.0, 7 * 86400.0

pytestmark = ACCOUNT_TESTS   # creates Unix accounts


@pytest.fixture
def top():
    with shared_dir("iadeep-fairshare-") as path:
        yield path


def _seed_history(home: Path, now: float) -> None:
    """alice's 100 GPU-hours: one job that held a GPU from 101 h to 1 h ago, recorded as the
    controller records one (its events)."""
    home.mkdir(parents=True)
    store = Store(StateDir(home).db)
    with store.tx() as c:
        job_id, _ = jobrows.insert(c, ALICE, JobSpec("/old.sh"), now - 102 * H)
        jobrows.transition(c, job_id, JobState.STARTING, "placed", "controller", now - 101 * H,
                           node="gone", gpu_indices=(0,))
        jobrows.transition(c, job_id, JobState.RUNNING, "started", "controller", now - 101 * H)
        jobrows.transition(c, job_id, JobState.SUCCEEDED, "exit 0", "controller", now - H,
                           exit_code=0)
    store.close()


def _first_start(home: Path, job_id: int) -> float:
    shown = json.loads(cli(home, "queue", "show", str(job_id), "--json", check=True).stdout)
    return min(e["at"] for e in shown["events"] if e["new_state"] == "starting")


def test_the_user_who_ran_100_gpu_hours_waits_behind_the_one_who_ran_none(sshd_cluster, top):
    cluster = sshd_cluster(1)
    cluster.node("node01").set_fake(gpus=1)
    inventory = top / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 10\n"
                         "  policy: {fairshare: {half_life_days: 7, weight: 10}}\n"
                         + cluster.inventory_yaml())
    home = top / "state"
    seeded = time.time()
    _seed_history(home, seeded)
    ctl = ControllerProcess(home, inventory).start()
    try:
        go = top / "go"
        blocker = queue_add(home, "--exclusive", sh_script(
            top, "block.sh", f"n=0; while [ ! -e {go} ] && [ $n -lt 900 ]; do sleep 0.1; "
                             "n=$((n+1)); done"))
        wait_until(lambda: jobs_by_id(home)[blocker]["state"] == "running", limit=120)
        short = sh_script(top, "short.sh", "sleep 0.5")
        first = submitted(cli_as(ALICE, home, "queue", "add", "--exclusive", short))
        second = submitted(cli_as(BOB, home, "queue", "add", "--exclusive", short))

        def why(user, job_id):   # once a round counted all three users (bob submitted last)
            out = cli_as(user, home, "queue", "why", str(job_id))
            return out["out"] if "= 33% of the shares" in out["out"] else None
        bob_why = wait_until(lambda: why(BOB, second), limit=120)
        alice_why = wait_until(lambda: why(ALICE, first), limit=120)
        print(alice_why, bob_why, sep="")   # docs/scheduling.md's example comes from here

        # `queue show --json`: each part, checked against the formula by hand
        shown = json.loads(cli(home, "queue", "show", str(first), "--json",
                               check=True).stdout)["effective_priority"]
        fs = shown["fairshare"]
        at = fs["at"]   # the round that worked it out
        by_hand = WEEK / math.log(2) * (2 ** (-(at - (seeded - H)) / WEEK)
                                        - 2 ** (-(at - (seeded - 101 * H)) / WEEK)) / H
        assert fs["usage_gpu_h"] == pytest.approx(by_hand, rel=1e-6)
        assert 81 < by_hand < 82   # 100 GPU-hours, most of them days old
        assert fs["user"] == ALICE and fs["share"] == 1.0 and fs["weight"] == 10.0
        # three users count: alice (usage, waiting), bob (waiting), root (the blocker runs)
        assert fs["share_norm"] == pytest.approx(1 / 3)
        assert fs["factor"] == pytest.approx(2 ** -(fs["usage_norm"] / fs["share_norm"]))
        assert fs["usage_norm"] > 0.99          # root's blocker has run for seconds only
        assert fs["points"] == pytest.approx(10 * fs["factor"])
        assert shown["effective"] == pytest.approx(shown["base"] + shown["aging"] + fs["points"])
        bob = json.loads(cli(home, "queue", "show", str(second), "--json",
                             check=True).stdout)["effective_priority"]
        assert bob["fairshare"]["factor"] == 1.0 and bob["fairshare"]["usage_gpu_h"] == 0.0
        assert bob["effective"] > shown["effective"] + 8   # 10 x (1 - 1/8), less the aging
        # the text says the same, part by part (read a moment earlier: aging may differ by
        # the seconds between, and the record by a 30 s rewrite)
        # (the lines `queue why` adds around them: the run-time estimate, the forecast, the
        # job's label)
        said = re.search(rf"job {first} is queued: .*\n(?:expected .*\n)*effective priority "
                         r"(\S+) = base 0 \+ "
                         r"aging (\S+) \(\S+ x 1/h\) \+ fair share (\S+)\n"
                         rf"  fair share of {ALICE}: used (\S+) GPU-hours \(decayed, "
                         r"half-life 7d\) = 100% of all use; share 1 = 33% of the shares; "
                         r"factor 2\^-\(1\.00/0\.33\) = (\S+) x weight 10\n(?:label .*\n)?$",
                         alice_why)
        assert said, alice_why
        effective, aging, points, used, factor = map(float, said.groups())
        assert effective == pytest.approx(aging + points, abs=0.011)
        assert points == pytest.approx(fs["points"], abs=0.006)
        assert used == pytest.approx(fs["usage_gpu_h"], abs=0.051)
        assert factor == pytest.approx(fs["factor"], abs=0.0006)
        assert aging == pytest.approx(shown["aging"], abs=0.011)

        go.touch()   # the GPU frees: bob's job must take it first, alice's after it
        done = wait_until(lambda: (lambda js: js if all(
            js[i]["state"] == "succeeded" for i in (first, second)) else None)(
            jobs_by_id(home)), limit=90)
        assert done[first]["user"] == ALICE and done[second]["user"] == BOB
        # one GPU, exclusive jobs: alice's started only once bob's had ended
        assert _first_start(home, second) < _first_start(home, first)
        bob_events = json.loads(cli(home, "queue", "show", str(second), "--json",
                                    check=True).stdout)["events"]
        assert bob_events[-1]["at"] <= _first_start(home, first)
    finally:
        ctl.stop()
        print(ctl.log.read_text()[-3000:])   # shown when the test failed

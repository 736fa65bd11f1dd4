"""`iadeep reserve` and `iadeep run` on bad input, against a real controller (no nodes): one
line naming what is wrong and how to fix it, a non-zero exit, and nothing recorded."""
import json
import subprocess
import time

import pytest

from helpers.accounts import needs_root
from helpers.controllers import cli, controller_on


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    ctl = controller_on(tmp_path_factory.mktemp("reserve"), nodes="[]")
    yield ctl.home
    ctl.stop()


@pytest.mark.parametrize("args, said", [
    (["--start", "tomorrow"], "Error: --start 'tomorrow' is not a date and time (hint: e.g. "
                              "--start 2026-12-10T09:00, or --start now)"),
    (["--duration", "soon"], "Error: --duration 'soon' is not a length of time (hint: e.g. 8h"),
    (["--duration", "0h"], "Error: --duration '0h' is not a length of time"),
    (["--user", "no-such-user-x"], "Error: no user 'no-such-user-x' on this machine"),
    (["--node", "gpu9"], "Error: no node named 'gpu9' in the controller's inventory"),
    (["--gpus", "0"], "Error: --gpus must be 1 or more, got 0"),
    (["--start", "2020-01-01T09:00"], "Error: that window is over already"),
    (["--duration", "120d"], "Error: a reservation may last at most 90 days"),
])
def test_reserve_add_refuses_bad_input_in_one_line(home, args, said):
    base = {"--user": "root", "--duration": "8h"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    out = cli(home, "reserve", "add", *[x for kv in base.items() for x in kv])
    assert out.returncode == 1 and out.stderr.startswith(said), out.stderr
    assert len(out.stderr.splitlines()) == 1
    assert json.loads(cli(home, "reserve", "list", "--json").stdout) == []


def test_reserve_round_trip_and_delete_of_an_unknown_one(home):
    start = time.strftime("%Y-%m-%dT%H:%M", time.localtime(time.time() + 3600))
    made = cli(home, "reserve", "add", "--user", "root", "--gpus", "2", "--start", start,
               "--duration", "1d12h", check=True).stdout
    rid = int(made.split()[1].rstrip(":"))
    assert made.endswith(f"2 GPU(s) for root from {start.replace('T', ' ')}:00 for 1d12h\n")
    table = cli(home, "reserve", "list", check=True).stdout.splitlines()
    assert table[0].split() == ["ID", "USER", "GPUS", "NODE", "START", "END", "HOLDS", "BY"]
    assert table[1].split()[:4] == [str(rid), "root", "2", "-"]
    assert table[1].split()[-2:] == ["-", "root"]          # no node up: holds nothing yet
    gone = cli(home, "reserve", "delete", "999")
    assert gone.returncode == 1 and gone.stderr == ("Error: no reservation 999 (hint: "
                                                    "`iadeep reserve list` shows them)\n")
    assert cli(home, "reserve", "delete", str(rid), check=True).stdout.startswith(
        f"deleted reservation {rid} (2 GPU(s) for root")


def test_run_refuses_an_array_and_a_missing_command(home):
    out = cli(home, "run", "--array", "0-3", "--", "true")
    assert out.returncode == 1 and out.stderr.startswith("Error: --array makes many jobs")
    out = cli(home, "run")
    assert out.returncode == 2 and "Error: missing argument 'COMMAND...'" in out.stderr
    assert json.loads(cli(home, "queue", "list", "--all", "--json").stdout) == []


@pytest.fixture(scope="module")
def lab8(tmp_path_factory):
    """Two 4-GPU nodes (by the inventory; never reachable) that run jobs as their submitters,
    of whom only iadeep-alice is allowed: root, and iadeep-bob, run no job there."""
    from helpers.accounts import ALICE, BOB, ensure_user

    ensure_user(ALICE)
    ensure_user(BOB)
    nodes = [f"{{name: {name}, host: 127.0.0.1, port: 9, gpus: [0, 1, 2, 3], "
             f"run_as: submitter, allowed_users: [{ALICE}]}}" for name in ("gpu1", "gpu2")]
    ctl = controller_on(tmp_path_factory.mktemp("reserve8"), nodes=f"[{', '.join(nodes)}]")
    yield ctl.home
    ctl.stop()


def _at(seconds_ahead: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M", time.localtime(time.time() + seconds_ahead))


@needs_root
@pytest.mark.os_global
def test_reservations_far_ahead_overbooked_too_large_or_for_non_members_are_refused(lab8):
    """Each used to be accepted: a start 300 days ahead (30 days at most by default), a user who
    runs no job on those nodes (root; an account outside allowed_users), more GPUs than the
    node or the cluster has, and a second 3-GPU reservation on a 4-GPU node over the same hours
    (it would silently hold 1). Each is one line and records nothing; what fits is kept."""
    from helpers.accounts import ALICE, BOB

    def add(*args: str, check: bool = False) -> subprocess.CompletedProcess:
        return cli(lab8, "reserve", "add", "--duration", "8h", *args, check=check)

    def refused(said: str, *args: str) -> None:
        before = cli(lab8, "reserve", "list", "--json", check=True).stdout
        out = add(*args)
        assert out.returncode == 1 and out.stderr.startswith(f"Error: {said}"), out.stderr
        assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
        assert cli(lab8, "reserve", "list", "--json", check=True).stdout == before

    refused("a reservation may start at most 30 days ahead (lab.reservation_ahead)",
            "--user", ALICE, "--start", _at(300 * 86400))
    refused("--user root: no job of theirs could use the reservation: root may not run jobs",
            "--user", "root", "--start", _at(3600))
    refused(f"--user {BOB}: no job of theirs could use the reservation", "--user", BOB,
            "--node", "gpu1", "--start", _at(3600))
    refused("--gpus 1000: the cluster has 8 GPU(s)", "--user", ALICE, "--gpus", "1000")
    refused("--gpus 5: node gpu1 has 4 GPU(s)", "--user", ALICE, "--gpus", "5", "--node", "gpu1")
    # overbooking: 3 of gpu1's 4 GPUs for the hours 2-10 ahead, then another 3 from hour 4
    add("--user", ALICE, "--gpus", "3", "--node", "gpu1", "--start", _at(2 * 3600),
        check=True)
    refused("--gpus 3 would overbook node gpu1: other reservations hold 3 of its 4 GPU(s)",
            "--user", ALICE, "--gpus", "3", "--node", "gpu1", "--start", _at(4 * 3600))
    add("--user", ALICE, "--gpus", "1", "--node", "gpu1", "--start", _at(4 * 3600),
        check=True)                                             # the 4th GPU: fits
    add("--user", ALICE, "--gpus", "3", "--node", "gpu1", "--start", _at(11 * 3600),
        check=True)                                             # after the first: fits
    refused("--gpus 5 would overbook the cluster: other reservations hold 4 of its 8 GPU(s)",
            "--user", ALICE, "--gpus", "5", "--start", _at(5 * 3600))
    add("--user", ALICE, "--gpus", "4", "--start", _at(5 * 3600), check=True)
    add("--user", ALICE, "--gpus", "4", "--node", "gpu2", "--start", _at(20 * 86400),
        check=True)                                             # within 30 days ahead
    assert len(json.loads(cli(lab8, "reserve", "list", "--json", check=True).stdout)) == 5

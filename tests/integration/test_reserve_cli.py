"""`iadeep reserve` and `iadeep run` on bad input, against a real controller (no nodes): one
line naming what is wrong and how to fix it, a non-zero exit, and nothing recorded."""
import json
import time

import pytest

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

"""`iadeep status` never calls a node "up" on old data: real controllers and sshd nodes."""
import json
import os
import re

import pytest

from helpers.accounts import BOB, cli_as, needs_root, shared_dir
from helpers.controllers import ControllerProcess, cli, wait_until


def _status(home) -> dict:
    return json.loads(cli(home, "status", "--json", check=True).stdout)


def _states(home) -> dict:
    return {n["name"]: n["state"] for n in _status(home)["nodes"]}


def test_stale_and_no_longer_polled_nodes_do_not_read_up(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    home = tmp_path / "state"
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 3\n" +
                         cluster.inventory_yaml())
    ctl = ControllerProcess(home, inventory).start()
    try:
        wait_until(lambda: _states(home) == {"node01": "up", "node02": "up"}, limit=120)
        # While it runs, data is fresh for 3 polls or the node grace, whichever is longer
        # (a round waiting on a hung node can outlast several poll intervals).
        assert _status(home)["stale_after_s"] == 3
    finally:
        ctl.stop()
    # Nobody polls any more: once the data is older than three poll intervals it is stale.
    # (A node whose last poll before the stop failed, e.g. a GPU query slower than its 1 s on
    # a loaded machine, stays what it was last seen: down, with that error.)
    stopped = _status(home)
    assert stopped["stale_after_s"] == pytest.approx(0.9)
    last = {n["name"]: n["error"] for n in stopped["nodes"]}
    wait_until(lambda: _states(home) == {n: "stale" if e is None else "down"
                                         for n, e in last.items()})
    text = cli(home, "status", check=True).stdout
    if last["node01"] is None:
        assert re.search(r"^node01: stale \(last seen up\), data \d+s old$", text, re.M), text
    else:
        assert f"node01: DOWN ({last['node01']}), data" in text, text

    # A controller on an explicitly empty inventory: the old snapshots are still in the
    # database, but it polls none of those nodes.
    empty = tmp_path / "empty.yaml"
    empty.write_text("nodes: []\n")
    ctl = ControllerProcess(home, empty).start()
    try:
        assert _states(home) == {"node01": "removed", "node02": "removed"}
        text = cli(home, "status", check=True).stdout
    finally:
        ctl.stop()
    assert re.search(r"^controller: running \(pid \d+, 0 nodes\)$", text, re.M), text
    seen = "up" if last["node01"] is None else f"DOWN ({last['node01']})"
    assert f"node01: not in the controller's inventory (last seen {seen}), data" in text
    assert ": up" not in text


@pytest.mark.os_global
@needs_root
def test_a_member_reading_the_public_snapshot_sees_a_stopped_controllers_nodes_go_stale(
        sshd_cluster):
    """A member who may not read the database reads the controller's public snapshot while it
    is down; its nodes were recorded "up" by the running controller, which allowed them the
    node grace (here 30 s). Down, the docs' rule holds: "up" only on data younger than 3 polls,
    as the database reader (and the web page) say."""
    cluster = sshd_cluster(1)
    with shared_dir("iadeep-stale-") as top:
        home = top / "state"
        inventory = top / "nodes.yaml"
        inventory.write_text("lab:\n  poll_interval: 0.5\n  node_grace: 30\n" +
                             cluster.inventory_yaml())
        ctl = ControllerProcess(home, inventory).start()
        try:
            wait_until(lambda: _states(home) == {"node01": "up"}, limit=120)
            os.chmod(home, 0o755)
        finally:
            ctl.stop()   # writes the public snapshot: node01 "up"

        def member_status() -> dict:
            done = cli_as(BOB, home, "status", "--json")
            assert done["rc"] == 0, done
            return json.loads(done["out"])
        seen = member_status()
        assert seen["stale_after_s"] == pytest.approx(1.5)   # 3 polls, not the node grace
        wait_until(lambda: [n["state"] for n in member_status()["nodes"]] in
                   (["stale"], ["down"]), limit=30)
        text = cli_as(BOB, home, "status")
        assert text["rc"] == 0 and "node01: up" not in text["out"], text

"""The controller's model refit runs in a child process and the loop swaps its result in."""
from __future__ import annotations

import dataclasses
import json

from helpers.controllers import wait_until
from helpers.replay_pool import ReplayPool
from iadeep_cli.controller.round.loop import SchedulingLoop
from iadeep_cli.model.data import shipped_profiles
from iadeep_cli.profiles import CoLocation
from iadeep_cli.settings import Inventory, Node
from iadeep_cli.store import Store, profiles as profrows


def test_background_refit_runs_in_a_child_and_the_loop_loads_its_model(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    profs = shipped_profiles()
    lab = dataclasses.replace(profs["resnet18"], workload="labnet")
    with store.tx() as conn:
        profrows.upsert_profile(conn, lab, 0.0)
        profrows.add_colocation(conn, CoLocation("NVIDIA H200", ("labnet", "vgg16"),
                                                 (0.3, 0.5), 2), 0.0)
    node = Node("n1", host="localhost", local=True, workdir=str(tmp_path / "n1"))
    inventory = Inventory(nodes=(node,), poll_interval_s=1.0)
    loop = SchedulingLoop(store, inventory, ReplayPool(inventory, {"n1": 1}),
                          tmp_path / "scripts")          # refits in the background
    try:
        wait_until(lambda: "labnet" in loop.model.trained_on, limit=120)
        # the child wrote the fitted numbers next to the database; the loop loaded them
        assert (tmp_path / "interference-model.json").is_file()
        p = loop.model.predict_pair(lab, profs["vgg16"])
        assert p.method == "observed" and abs(p.speed_a - 0.3) < 0.05
        # a second request while one runs is not lost: it refits once more afterwards
        loop.refit()
        loop.refit()
        wait_until(lambda: not loop._fit_running, limit=120)
    finally:
        store.close()


def test_refit_child_reuses_its_last_selection(tmp_path, monkeypatch):
    """The refit reads its previous output: with the same data it skips the selection."""
    from iadeep_cli.controller.round import refit
    from iadeep_cli.model import fit

    monkeypatch.setattr(refit.os, "nice", lambda n: 0)
    out = tmp_path / "interference-model.json"
    assert refit.main(["--db", str(tmp_path / "none.db"), "--out", str(out)]) == 0
    assert "selected on" not in json.loads(out.read_text())["note"]

    def no_selection(*a):
        raise AssertionError("selection ran again")

    monkeypatch.setattr(fit, "_inner_cv", no_selection)
    assert refit.main(["--db", str(tmp_path / "none.db"), "--out", str(out)]) == 0
    assert "selected on" in json.loads(out.read_text())["note"]
    out.write_text("not json")                   # unreadable: a full fit, not a crash
    monkeypatch.undo()
    monkeypatch.setattr(refit.os, "nice", lambda n: 0)
    assert refit.main(["--db", str(tmp_path / "none.db"), "--out", str(out)]) == 0

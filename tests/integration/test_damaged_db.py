"""A database damaged on disk while the controller runs (a failing disk, a careless copy over
it) is found and reported: the controller degrades (refuses new jobs with the reason, which
`status` shows) instead of answering "bug" or going on as if nothing happened. A real
controller process and its real SQLite file."""
from __future__ import annotations

import json
import sqlite3

from helpers.controllers import ControllerProcess, cli, wait_until
from iadeep_cli.jobs import JobSpec
from iadeep_cli.store import Store, jobrows


def _degraded(home) -> str:
    status = json.loads(cli(home, "status", "--json", check=True).stdout)
    return (status["controller"].get("degraded") or {}).get("message", "")


def test_a_database_damaged_while_running_degrades_the_controller(tmp_path):
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\nnodes: []\n")
    ctl = ControllerProcess(tmp_path / "state", inventory).start()
    db = ctl.home / "iadeep.db"
    try:
        store = Store(db)   # a second writer beside the controller (WAL): a history to damage
        with store.tx() as conn:
            for i in range(300):
                jobrows.insert(conn, "old", JobSpec("/h.sh", args=("x" * 500,)), float(i))
        store.close()
        check = sqlite3.connect(db)
        check.execute("PRAGMA wal_checkpoint(TRUNCATE)")   # the pages into the file itself
        page = check.execute("PRAGMA page_size").fetchone()[0]
        check.close()
        assert _degraded(ctl.home) == ""
        with open(db, "r+b") as f:   # every page but the first (the schema) overwritten
            size = f.seek(0, 2)
            for offset in range(page, size, page):
                f.seek(offset)
                f.write(b"\xa5" * page)
        wait_until(lambda: "is damaged" in _degraded(ctl.home), limit=120, every=0.5)
        script = tmp_path / "x.sh"
        script.write_text("#!/bin/sh\ntrue\n")
        refused = cli(ctl.home, "queue", "add", str(script))
        assert refused.returncode == 1
        assert refused.stderr.startswith(f"Error: the controller's database {db} is damaged")
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
        assert ctl.proc.poll() is None
    finally:
        ctl.stop()

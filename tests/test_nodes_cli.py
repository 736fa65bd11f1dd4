"""`iadeep nodes check` end to end against real sshd nodes."""
from __future__ import annotations

import json

import pytest

from test_ssh_hostkeys import iadeep

pytestmark = pytest.mark.sshd


def test_check_json_and_exit_codes(sshd_cluster):
    c = sshd_cluster(2, key="cli")
    c.node("node02").set_fake(gpus=2)
    ok = iadeep("nodes", "check", "--inventory", str(c.inventory_path), "--json")
    assert ok.returncode == 0, ok.stderr
    data = {d["name"]: d for d in json.loads(ok.stdout)}
    assert set(data) == {"node01", "node02"} and all(d["ok"] for d in data.values())
    assert [g["index"] for g in data["node02"]["gpus"]] == [0, 1]
    assert {"uuid", "name", "memory_total_mib"} <= set(data["node01"]["gpus"][0])

    c.stop("node02")
    bad = iadeep("nodes", "check", "--inventory", str(c.inventory_path), "--timeout", "2")
    assert bad.returncode == 1
    line = next(ln for ln in bad.stdout.splitlines() if ln.startswith("node02"))
    assert "FAIL" in line and "cannot connect" in line
    assert "ok" in next(ln for ln in bad.stdout.splitlines() if ln.startswith("node01"))


def test_check_bad_inventory_is_one_line(tmp_path):
    bad = tmp_path / "nodes.yaml"
    bad.write_text("nodes:\n  - name: a\n    host: h\n    port: twenty\n")
    res = iadeep("nodes", "check", "--inventory", str(bad))
    assert res.returncode == 1 and res.stderr.startswith("Error: ") and "port" in res.stderr
    assert "Traceback" not in res.stderr

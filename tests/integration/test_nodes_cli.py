"""`iadeep nodes check` end to end against real sshd nodes."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

import pytest
from test_ssh_hostkeys import iadeep

from helpers.accounts import BOB, cli_as, needs_root, shared_dir
from iadeep_cli.paths import StateDir

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


def test_trust_answered_no_records_nothing_and_says_so(sshd_cluster):
    c = sshd_cluster(1, key="trust-no")
    c.write_known_hosts(trusted=False)
    StateDir.default().known_hosts.unlink(missing_ok=True)

    def trust(answer: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "iadeep_cli", "nodes", "trust", "node01",
                               "--inventory", str(c.inventory_path)], input=answer,
                              capture_output=True, text=True, env=dict(os.environ), timeout=60)

    for answer in ("n\n", ""):                     # "n", then no answer at all (end of input)
        res = trust(answer)
        assert res.returncode == 1 and "Aborted" not in res.stderr + res.stdout
        assert res.stderr.splitlines() == [
            "Error: host key of node01 not trusted; nothing was recorded (hint: answer y once "
            "the fingerprint matches the node's own (`ssh-keygen -lf "
            "/etc/ssh/ssh_host_*_key.pub` there), or pass --yes)"]
        assert "Trust this key?" in res.stdout and not StateDir.default().known_hosts.exists()
    yes = trust("y\n")
    assert yes.returncode == 0 and "recorded in" in yes.stdout
    assert StateDir.default().known_hosts.exists()


def test_check_says_how_to_trust_an_unknown_host_key(sshd_cluster):
    c = sshd_cluster(1, key="check-untrusted")
    c.write_known_hosts(trusted=False)
    StateDir.default().known_hosts.unlink(missing_ok=True)
    res = iadeep("nodes", "check", "--inventory", str(c.inventory_path), "--timeout", "5")
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("node01"))
    assert res.returncode == 1 and "unknown host key" in line, res.stdout
    assert "run `iadeep nodes trust node01`" in line, line


@pytest.mark.os_global
@needs_root
def test_an_admin_running_check_or_trust_as_themselves_is_told_to_use_the_controllers_account(
        sshd_cluster):
    """The admin's own ~/.ssh keys and known_hosts are not the controller's: instead of their
    errors (`identity_file ~pi/... does not exist`, `cannot read known_hosts`), one line that
    says which account to run it as, and how."""
    c = sshd_cluster(1, key="check-as-admin")
    with shared_dir("iadeep-nodes-admin-") as top:
        home = top / "state"
        home.mkdir()
        (home / "nodes.yaml").write_text(c.inventory_yaml())
        me = pwd.getpwuid(os.getuid()).pw_name
        for argv, command in ((["nodes", "check"], "iadeep nodes check"),
                              (["nodes", "trust", "node01", "--yes"],
                               "iadeep nodes trust node01")):
            done = cli_as(BOB, home, *argv)
            assert done["rc"] == 1 and done["err"].count("\n") == 1, done
            assert f"state directory {home} belongs to {me}, not {BOB}" in done["err"], done
            assert f"run it as the controller's account: sudo -u {me} sh -lc '{command}'" in \
                done["err"], done

"""Host keys: unknown refused with the trust hint, `nodes trust --yes` works, changed refused."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from iadeep_cli.errors import HostKeyError
from iadeep_cli.nodes.poller import NodePool
from iadeep_cli.paths import StateDir

pytestmark = pytest.mark.sshd


def iadeep(*args, env=None):
    code = "import sys; from iadeep_cli.cli.main import main; sys.argv[0]='iadeep'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def test_unknown_then_trust_then_changed(sshd_cluster):
    c = sshd_cluster(2, key="hostkeys")
    c.write_known_hosts(trusted=False)
    StateDir.default().known_hosts.unlink(missing_ok=True)
    with NodePool(c.inventory, connect_timeout=3, backoff_base=0) as pool:
        snap = pool.poll("node01")
        with pytest.raises(HostKeyError) as exc:
            pool.connection("node01").client()
    assert "unknown host key" in snap.error
    assert "iadeep nodes trust node01" in exc.value.hint

    refused = iadeep("nodes", "trust", "node01", "--inventory", str(c.inventory_path),
                     env={"HOME": str(c.home)})   # no --yes, no tty answer: aborted
    assert refused.returncode != 0 and not StateDir.default().known_hosts.exists()
    ok = iadeep("nodes", "trust", "node01", "--inventory", str(c.inventory_path), "--yes")
    assert ok.returncode == 0, ok.stderr
    pub_b64 = c.node("node01").known_hosts_line().split()[2]
    assert pub_b64 in StateDir.default().known_hosts.read_text()
    fp = subprocess.run(["ssh-keygen", "-lf", str(c.node("node01").host_key) + ".pub"],
                        capture_output=True, text=True).stdout.split()[1]
    assert fp in ok.stdout                       # the fingerprint shown is OpenSSH's
    again = iadeep("nodes", "trust", "node01", "--inventory", str(c.inventory_path), "--yes")
    assert "already trusted" in again.stdout

    with NodePool(c.inventory, connect_timeout=3, backoff_base=0) as pool:
        assert pool.poll("node01").ok
        assert "unknown host key" in pool.poll("node02").error

    c.node("node01").new_host_key()
    with NodePool(c.inventory, connect_timeout=3, backoff_base=0) as pool:
        changed = pool.poll("node01")
    assert "CHANGED" in changed.error
    before = StateDir.default().known_hosts.read_text()
    res = iadeep("nodes", "trust", "node01", "--inventory", str(c.inventory_path), "--yes")
    assert res.returncode == 1 and "CHANGED" in res.stderr and "ssh-keygen -R" in res.stderr
    assert "Traceback" not in res.stderr
    assert StateDir.default().known_hosts.read_text() == before     # never replaced


def test_marker_and_corrupt_known_hosts_lines_do_not_stop_polling(sshd_cluster):
    """A lab using an SSH CA has @cert-authority lines; one odd line must not break the rest,
    and a key listed only under @revoked or @cert-authority is still not trusted."""
    c = sshd_cluster(2, key="markers")
    trusted = c.node("node01").known_hosts_line()
    other = c.node("node02").known_hosts_line()
    c.known_hosts.write_text(
        "@cert-authority *.lab.example.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHVz\n"
        f"@revoked {other}\n"
        "this line is not a known_hosts entry\n"
        f"{trusted}\n")
    StateDir.default().known_hosts.unlink(missing_ok=True)
    with NodePool(c.inventory, connect_timeout=3, backoff_base=0) as pool:
        snap = pool.poll_all()
    by = {n.name: n for n in snap.nodes}
    assert by["node01"].ok, by["node01"].error
    assert not by["node02"].ok and "unknown host key" in by["node02"].error

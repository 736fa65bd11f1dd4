"""Polling real sshd nodes (127.0.0.x) running the stand-in nvidia-smi; faults per node."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace

import pytest

from iadeep_cli.nodes.poller import NodePool
from iadeep_cli.settings import Inventory, Node

pytestmark = pytest.mark.sshd


def pool_for(inv, **kw):
    # generous: a healthy node must never miss them, also on a machine loaded by parallel
    # tests (a test of a timeout passes its own)
    kw.setdefault("connect_timeout", 30)
    kw.setdefault("command_timeout", 60)
    kw.setdefault("backoff_base", 0)
    return NodePool(inv, **kw)


def test_poll_all_modes_each_node_its_own_result(sshd_cluster, smi_fixture):
    c = sshd_cluster(5)
    modes = {"node01": None, "node02": "loaded", "node03": "nogpu", "node04": "driverfail",
             "node05": "missing"}
    for name, mode in modes.items():
        c.node(name).set_fake(mode=mode)
    with pool_for(c.inventory) as pool:
        snap = pool.poll_all()
    by = {n.name: n for n in snap.nodes}
    assert by["node01"].ok and len(by["node01"].gpus) == 1 and by["node01"].rtt_s > 0
    # the stand-in also lists any launched job on this shared machine: compare the fixture's
    fixture = {int(line.split(",")[0]) for line in smi_fixture(
        "h200-loaded-compute-apps-full.csv-noheader-nounits.txt").splitlines() if line.strip()}
    assert by["node02"].ok and len(fixture) == 14
    assert fixture <= {p.pid for p in by["node02"].gpus[0].foreign_processes}
    # pmon's per-process figures, over SSH: those of the H200 capture (NVML's samples then)
    util = {p.pid: (p.sm_util, p.mem_util) for p in by["node02"].gpus[0].processes}
    assert util[458] == (17.0, 4.0) and util[451] == (5.0, 2.0) and util[459] == (None, None)
    assert by["node03"].ok and by["node03"].gpus == ()
    assert "couldn't communicate with the NVIDIA driver" in by["node04"].error
    assert "nvidia-smi not found" in by["node05"].error


def test_a_warning_on_stderr_does_not_break_the_node(sshd_cluster):
    c = sshd_cluster(5)
    c.node("node01").set_fake(mode="warn", gpus=2)
    with pool_for(c.inventory) as pool:
        n = pool.poll("node01")
    assert n.ok, n.error
    assert [g.name for g in n.gpus] == ["NVIDIA H200", "NVIDIA H200"]


def test_many_gpus_and_na_values(sshd_cluster):
    c = sshd_cluster(5)
    c.node("node01").set_fake(mode="na", gpus=4)
    with pool_for(c.inventory) as pool:
        n = pool.poll("node01")
    assert [g.index for g in n.gpus] == [0, 1, 2, 3]
    assert len({g.uuid for g in n.gpus}) == 4
    assert all(g.power_draw_w is None and g.utilization_gpu is None for g in n.gpus)
    assert all(g.memory_total_mib is not None for g in n.gpus)
    # per-process utilisation not supported: pmon's `-`, no figure
    assert n.gpus[0].processes and all(p.sm_util is None for p in n.gpus[0].processes)


def test_connection_is_reused(sshd_cluster):
    c = sshd_cluster(5)
    with pool_for(c.inventory) as pool:
        pool.poll_all()
        transports = {name: pool.connection(name).client().get_transport()
                      for name in c.nodes}
        pool.poll_all()
        pool.run("node01", ["true"])
        assert all(pool.connection(n).client().get_transport() is t
                   for n, t in transports.items())


def test_slow_node_does_not_hold_back_the_others(sshd_cluster):
    c = sshd_cluster(5)
    c.node("node03").set_fake(hold=True)   # hung until let go below, however long a round is
    with pool_for(c.inventory) as pool:
        snap = pool.poll_all(wait_s=1)
        again = pool.poll_all(wait_s=1)   # still hung: not polled twice, not waited for
        c.node("node03").set_fake()
        deadline = time.monotonic() + 60  # its answer, when it comes, is used by a later round
        late = pool.poll_all(wait_s=1)
        while not late.node("node03").reached and time.monotonic() < deadline:
            time.sleep(0.2)
            late = pool.poll_all(wait_s=1)
    by = {n.name: n for n in snap.nodes}
    assert "its poll is still running" in by["node03"].error and not by["node03"].reached
    assert all(by[n].ok and by[n].reached for n in c.nodes if n != "node03")
    assert "its poll is still running" in again.node("node03").error
    assert late.node("node03").ok and late.node("node03").taken_at < again.taken_at


def test_command_timeout_is_a_node_error(sshd_cluster):
    c = sshd_cluster(5)
    c.node("node02").set_fake(hold=True)
    # node01 must answer within the timeout: 8 s, not 1, on a machine loaded by parallel tests
    # (and under the pool's 10 s for the GPU query, which would otherwise end first)
    with pool_for(c.inventory, command_timeout=8) as pool:
        snap = pool.poll_all()
    c.node("node02").set_fake()
    assert "did not finish within 8 s" in snap.node("node02").error
    assert snap.node("node01").ok


def test_sshd_killed_mid_poll_then_back(sshd_cluster):
    c = sshd_cluster(5)
    c.node("node02").set_fake(sleep=2)
    with pool_for(c.inventory) as pool:
        assert pool.poll("node01").ok
        result = {}
        t = threading.Thread(target=lambda: result.update(s=pool.poll_all()))
        t.start()
        time.sleep(0.7)
        c.stop("node02")     # listener and its session processes: SIGKILL
        t.join(120)   # (only bounds a hang: it ends about when node02's sleep would)
        assert not t.is_alive()
        c.node("node02").set_fake()
        down = pool.poll("node02")
        c.start("node02")
        up = pool.poll("node02")
    assert result["s"].node("node01").ok
    assert not down.ok and ("cannot connect" in down.error or "lost" in down.error)
    assert up.ok


def test_address_that_never_answers_is_bounded(sshd_cluster):
    c = sshd_cluster(5)
    silent = socket.socket()
    silent.bind(("127.0.0.250", 0))
    silent.listen(5)                       # accepts (kernel backlog), never says a word
    port = silent.getsockname()[1]
    try:
        inv = c.inventory
        dead = Node(name="silent", host="127.0.0.250", port=port, user=c.user,
                    identity_file=str(c.user_key))
        inv = replace(inv, nodes=(*inv.nodes, dead))
        # 10 s bounds the silent node's connect and also the healthy nodes' handshakes, which
        # must fit in it on a machine loaded by parallel tests (1 s did not always)
        with pool_for(inv, connect_timeout=10) as pool:
            snap = pool.poll_all()
            again = pool.poll("silent")
    finally:
        silent.close()
    assert "no answer" in snap.node("silent").error or "cannot connect" in snap.node("silent").error
    assert all(snap.node(n).ok for n in c.nodes)
    assert again.error  # still failing, not hanging


def test_backoff_fails_fast_until_retry_time(sshd_cluster):
    c = sshd_cluster(5)
    c.stop("node04")
    with pool_for(c.inventory, backoff_base=30) as pool:
        first = pool.poll("node04")
        second = pool.poll("node04")
    assert "cannot connect" in first.error
    assert "next retry in" in second.error


def test_ssh_config_alias_and_proxyjump(sshd_cluster):
    c = sshd_cluster(5)
    n1, n3 = c.node("node01"), c.node("node03")
    cfg = c.home / ".ssh" / "config"
    original = cfg.read_text()
    cfg.write_text(original + f"Host jumped\n  HostName {n3.addr}\n  Port {n3.port}\n"
                              f"  User {c.user}\n  IdentityFile {c.user_key}\n"
                              "  ProxyJump node01-alias\n")
    try:
        inv = Inventory(nodes=(Node(name="aliased", host="node02-alias"),
                               Node(name="jumped", host="jumped")))
        with pool_for(inv) as pool:
            snap = pool.poll_all()
            jumps = pool.connection("jumped")._jumps
            jump_peer = jumps[0].get_transport().getpeername()[:2] if jumps else None
            _, out, _ = pool.run("jumped", "echo $SSH_CONNECTION")
    finally:
        cfg.write_text(original)
    assert snap.node("aliased").ok, snap.node("aliased").error
    assert snap.node("jumped").ok, snap.node("jumped").error
    assert len(jumps) == 1 and jump_peer == (n1.addr, n1.port)
    assert out.split()[2:4] == [n3.addr, str(n3.port)]


def test_ssh_config_proxycommand_through_a_real_hop(sshd_cluster, tmp_path):
    """ProxyCommand (labs reach nodes behind a gateway this way, e.g. `ssh -W %h:%p gw`):
    OpenSSH's own client as the hop, through a real sshd node; the command ran (its log), and
    the session reached the node behind it."""
    c = sshd_cluster(5)
    n3 = c.node("node03")
    cfg = c.home / ".ssh" / "config"
    original = cfg.read_text()
    used = tmp_path / "proxy.log"
    cfg.write_text(original + f"Host behind-gateway\n  HostName {n3.addr}\n  Port {n3.port}\n"
                              f"  User {c.user}\n  IdentityFile {c.user_key}\n"
                              f"  ProxyCommand sh -c 'echo %h:%p >> {used}; exec ssh -F {cfg} "
                              f"-o BatchMode=yes -o UserKnownHostsFile={c.known_hosts} "
                              "-W %h:%p node01-alias'\n")
    try:
        inv = Inventory(nodes=(Node(name="behind", host="behind-gateway"),))
        with pool_for(inv) as pool:
            snap = pool.poll_all()
            _, out, _ = pool.run("behind", "echo $SSH_CONNECTION")
    finally:
        cfg.write_text(original)
    assert snap.node("behind").ok, snap.node("behind").error
    assert used.read_text().splitlines() == [f"{n3.addr}:{n3.port}"]   # one connection
    assert out.split()[2:4] == [n3.addr, str(n3.port)]


def test_a_proxycommand_that_fails_is_a_node_error_naming_it(sshd_cluster):
    c = sshd_cluster(1)
    cfg = c.home / ".ssh" / "config"
    original = cfg.read_text()
    cfg.write_text(original + "Host nowhere\n  ProxyCommand sh -c 'exit 3'\n")
    try:
        with pool_for(Inventory(nodes=(Node(name="gone", host="nowhere"),))) as pool:
            error = pool.poll_all().node("gone").error
    finally:
        cfg.write_text(original)
    assert error and "node gone: " in error and "ProxyCommand (sh -c 'exit 3')" in error, error


def test_run_quotes_argv(sshd_cluster):
    c = sshd_cluster(5)
    tricky = ["a b", "$(echo no)", "x;y", "q'uote\"", "new\nline", ""]
    with pool_for(c.inventory) as pool:
        rc, out, _ = pool.run("node01", ["printf", "<%s>", *tricky])
    assert rc == 0 and out == "".join(f"<{a}>" for a in tricky)

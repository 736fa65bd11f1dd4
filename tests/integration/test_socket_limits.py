"""The controller's socket under hostile load: one account's flood of idle connections, slow
and idle clients, oversized requests. Real controller processes (under systemd's default
open-file limit where it matters), real second OS accounts, a real sshd node."""
import os
import resource
import select
import threading
from pathlib import Path

import pytest

from helpers.accounts import AsUser, cli_as, cli_here, ensure_user, needs_root, shared_dir, warm_cli
from helpers.controllers import ControllerProcess, cli, jobs_by_id, queue_add, wait_until
from helpers.floods import (
    connect as _connect,
    hold_idle,
    idle_connections,
    keep_open,
    reply_of as _reply_of,
    stall_uploads,
)
from iadeep_cli.controller.requests import server
from iadeep_cli.controller.requests.server import (
    MAX_PER_USER,
    REQUEST_TIMEOUT_S,
    connection_cap,
    per_user_cap,
    reserve,
)
from iadeep_cli.jobs import SubmitSpec

pytestmark = needs_root   # creates Unix accounts

FLOODER, OTHER = "iadeep-flood", "iadeep-bob"
SYSTEMD_NOFILE = 1024   # systemd's default for a service
TIMED_OUT = f"no complete request within {REQUEST_TIMEOUT_S:g} s"


def _nofile(n: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


@pytest.fixture
def shared_state():
    """A state directory other accounts can reach (pytest's tmp_path is private to root)."""
    with shared_dir("iadeep-sock-") as state:
        (state / "empty.yaml").write_text("nodes: []\n")
        yield state


def _flood(path: str, n: int, home: str, ready_w: int, stop_r: int) -> dict:
    """As the flooding account: open ``n`` connections and send nothing; try the real CLI
    while they are open; then keep the controller's places for this account full (reopen
    each connection it drops for idling) until told to stop. Returns what it was told."""
    live = idle_connections(path, n)
    own_cli = cli_here(home, "status")
    os.write(ready_w, b"r")

    def classify(reply: str) -> str:
        if f"{FLOODER} already has {MAX_PER_USER} connections" in reply:
            return "refused"
        return "timed out" if TIMED_OUT in reply else "other: " + reply[:300]

    seen = keep_open(path, live, stop_r, classify)
    other = [kind.removeprefix("other: ") for kind in seen if kind.startswith("other: ")]
    return {"refused": seen["refused"], "timed out": seen["timed out"], "other": other,
            "own_cli": own_cli}


def test_one_account_flooding_the_socket_cannot_take_the_controller_offline(
        sshd_cluster, shared_state):
    cluster = sshd_cluster(1)
    inventory = shared_state / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n" + cluster.inventory_yaml())
    ctl = ControllerProcess(shared_state / "home", inventory,
                            preexec_fn=_nofile(SYSTEMD_NOFILE)).start()
    ensure_user(OTHER)
    warm_cli("status")
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    flood = AsUser(FLOODER, _flood, str(ctl.home / "controller.sock"), 1100, str(ctl.home),
                   ready_w, stop_r)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"r", "the flooding process failed"
        # Another account is served as usual while the flood goes on ...
        other = cli_as(OTHER, ctl.home, "status")
        assert other["rc"] == 0 and "controller: running" in other["out"], other
        # ... and the scheduling loop still places and finishes a job.
        script = shared_state / "quick.sh"
        script.write_text("#!/bin/sh\necho placed\n")
        job = queue_add(ctl.home, str(script))
        wait_until(lambda: jobs_by_id(ctl.home)[job]["state"] == "succeeded", limit=120,
                   every=0.5)
        # Sanity bound, not a timing: the caps keep most descriptors free.
        assert len(os.listdir(f"/proc/{ctl.proc.pid}/fd")) < SYSTEMD_NOFILE // 2
    finally:
        os.write(stop_w, b"s")
        result = flood.result()
        ctl.stop()
    assert result["other"] == []
    assert result["refused"] >= 1100 - MAX_PER_USER
    own = result["own_cli"]
    assert own["rc"] == 1 and own["out"] == ""
    assert own["err"].startswith(f"Error: {FLOODER} already has {MAX_PER_USER} connections")
    assert own["err"].count("\n") == 1
    assert "Too many open files" not in ctl.log.read_text()


def test_total_connections_are_capped_by_the_open_file_limit_and_freed(shared_state):
    ctl = ControllerProcess(shared_state / "home", shared_state / "empty.yaml",
                            preexec_fn=_nofile(64)).start()
    try:
        cap = 64 // 4   # a quarter of the limit
        mine = per_user_cap(cap)   # one account's share, below the total and MAX_PER_USER
        assert mine < cap - reserve(cap) and mine < MAX_PER_USER
        idle = [_connect(ctl.home / "controller.sock") for _ in range(mine)]
        # asked in this process: a new interpreter's start-up could outlast the idle timeout
        # on a loaded machine, and the idle connections would be gone before it asked
        refused = cli_here(ctl.home, "status")
        assert refused["rc"] == 1
        assert refused["err"].startswith(f"Error: root already has {mine} connections")
        # Each is dropped for idling (one may have been refused instead if the connection of
        # start()'s own status check had not been counted out yet), and its place given back.
        assert sum(TIMED_OUT in _reply_of(s) for s in idle) >= mine - 1
        assert cli(ctl.home, "status").returncode == 0
    finally:
        ctl.stop()


@pytest.mark.os_global   # creates OS accounts
def test_a_few_accounts_holding_their_share_never_lock_another_member_out(shared_state):
    """Four accounts each keep 40 idle connections open (at systemd's 1,024 open files): each
    holds its share, and another member's commands still get in, every time."""
    ctl = ControllerProcess(shared_state / "home", shared_state / "empty.yaml",
                            preexec_fn=_nofile(SYSTEMD_NOFILE)).start()
    cap = connection_cap(SYSTEMD_NOFILE)
    assert 4 * per_user_cap(cap) <= cap - reserve(cap)
    ensure_user(OTHER)
    warm_cli("status")
    stop_r, stop_w = os.pipe()
    floods, readies = [], []
    try:
        for i in range(4):
            ready_r, ready_w = os.pipe()
            floods.append(AsUser(f"iadeep-flood{i}", hold_idle, str(ctl.home / "controller.sock"),
                                 40, ready_w, stop_r))
            os.close(ready_w)
            readies.append(ready_r)
        for ready_r in readies:
            assert os.read(ready_r, 1) == b"r", "a flooding process failed"
        for _ in range(5):
            other = cli_as(OTHER, ctl.home, "status")
            assert other["rc"] == 0 and "controller: running" in other["out"], other
    finally:
        os.write(stop_w, b"s" * 4)
        results = [f.result() for f in floods]
        ctl.stop()
    for result in results:
        assert result.get("other", 0) == 0 and result.get("refused", 0) >= 40 - per_user_cap(cap)


@pytest.mark.os_global   # creates OS accounts
def test_two_accounts_stalling_uploads_never_make_another_members_status_wait(
        shared_state, monkeypatch):
    """Two accounts' stalled uploads hold every upload place they may (here they would hold
    them for minutes); another member's `status` is answered all the same: uploads and
    answers have places of their own, per account and with a reserve."""
    from iadeep_cli.controller.runtime import Controller
    from iadeep_cli.settings import Inventory

    monkeypatch.setattr(server, "REQUEST_TIMEOUT_S", 300.0)   # the stall outlasts the test
    monkeypatch.setattr(server, "PLACE_WAIT_S", 3.0)   # a request with no place: busy, soon
    ctl = Controller(Inventory(nodes=()), shared_state / "home")
    ctl.heartbeat()
    ctl.socket.start()
    ensure_user(OTHER)
    warm_cli("status")
    stop_r, stop_w = os.pipe()
    floods, readies = [], []
    try:
        for i in range(2):
            ready_r, ready_w = os.pipe()
            floods.append(AsUser(f"iadeep-flood{i}", stall_uploads, str(ctl.socket.path), 4,
                                 ready_w, stop_r))
            os.close(ready_w)
            readies.append(ready_r)
        for ready_r in readies:
            assert os.read(ready_r, 1) == b"r", "an uploading process failed"
        for _ in range(3):
            other = cli_as(OTHER, ctl.state.root, "status")
            assert other["rc"] == 0 and "controller: running" in other["out"], other
    finally:
        os.write(stop_w, b"s" * 2)
        read = [f.result() for f in floods]
        ctl.socket.close()
        ctl.store.close()
    assert sum(read) >= 2   # each account had one read that far, and held it


def test_a_slow_client_is_dropped(shared_state):
    ctl = ControllerProcess(shared_state / "home", shared_state / "empty.yaml").start()
    try:
        slow = _connect(ctl.home / "controller.sock")
        request = b'{"op": "status", "args": {}}\n'
        sent = 0
        for _ in range(240):   # one byte every half second, never the last one
            if select.select([slow], [], [], 0.5)[0]:
                break
            if sent < len(request) - 1:
                slow.send(request[sent:sent + 1])
                sent += 1
        assert TIMED_OUT in _reply_of(slow)
        assert sent < len(request) - 1
    finally:
        ctl.stop()


def _peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


def test_oversized_requests_are_refused_and_memory_stays_bounded(shared_state):
    ctl = ControllerProcess(shared_state / "home", shared_state / "empty.yaml").start()
    payload = b'{"op": "add", "args": {"script_b64": "' + b"A" * (16 * 2**20)
    replies = []

    def send_one() -> None:
        s = _connect(ctl.home / "controller.sock")
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass   # refused before it was all sent; the reason is waiting to be read
        replies.append(_reply_of(s))
        s.close()

    try:
        threads = [threading.Thread(target=send_one) for _ in range(MAX_PER_USER - 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(replies) == len(threads)
        assert all('"InputError"' in r and "request larger than 6 MiB refused" in r
                   for r in replies), replies[:3]
        # Sanity bound, not a timing: 30 x 16 MB read whole would take 480 MB and more.
        assert _peak_rss_kib(ctl.proc.pid) < 300 * 1024
        # The client shows the reason although the controller stopped reading its request.
        from iadeep_cli.controller import client
        from iadeep_cli.errors import InputError
        with pytest.raises(InputError, match="request larger than 6 MiB refused"):
            client.call("add", {"spec": {"script": "/bin/true"}, "script_b64": "A" * 2**24},
                        socket_path=ctl.home / "controller.sock")
        assert cli(ctl.home, "status").returncode == 0
    finally:
        ctl.stop()


def test_the_largest_script_is_accepted_even_many_at_once(shared_state, monkeypatch):
    ctl = ControllerProcess(shared_state / "home", shared_state / "empty.yaml").start()
    biggest = b"#!/bin/sh\n" + b"#" * (4 * 2**20 - 11) + b"\n"
    script = shared_state / "big.sh"
    script.write_bytes(biggest)
    try:
        assert cli(ctl.home, "queue", "add", str(script)).returncode == 0
        script.write_bytes(biggest + b"\n")
        too_big = cli(ctl.home, "queue", "add", str(script))
        assert too_big.returncode == 1 and "is larger than 4 MiB" in too_big.stderr
        # More at once than are read at once: the others wait their turn, none is refused.
        monkeypatch.setenv("IADEEP_HOME", str(ctl.home))
        from iadeep_cli.controller import client
        ids, errors = [], []

        def submit(i: int) -> None:
            try:
                spec = SubmitSpec.from_dict({"script": str(script), "name": f"big{i}"})
                ids.append(client.submit(spec, biggest).id)
            except Exception as exc:   # reported below
                errors.append(repr(exc))

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(set(ids)) == 12
    finally:
        ctl.stop()

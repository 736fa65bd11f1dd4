"""`iadeep web` against hostile clients, with real sockets (no browser needed): slow
connections by the thousand cannot stop it answering nor fill its stderr with tracebacks, a
request addressed to a name it was not given (DNS rebinding through the SSH tunnel) is refused,
and however many clients fetch the view the controller is asked once per poll interval.
"""
from __future__ import annotations

import json
import math
import resource
import socket
import struct
import subprocess
import threading
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import seed
from helpers.controllers import IADEEP, env_for

SLOW = 1200


def _web(home: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """`iadeep web` on a free port with the usual 1,024 file descriptors; (process, port)."""
    def usual_limit() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))

    proc = subprocess.Popen([*IADEEP, "web", "--listen", "127.0.0.1:0", *args],
                            env=env_for(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=usual_limit)
    assert proc.stdout is not None
    line = proc.stdout.readline()     # "serving http://127.0.0.1:PORT/ (...)"
    assert line.startswith("serving http://"), line
    return proc, int(line.split()[1].rstrip("/").rsplit(":", 1)[1])


def _stop(proc: subprocess.Popen) -> str:
    """Stop the server; what it wrote on stderr."""
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    return err


def _ask(port: int, host: str | None, path: str = "/api/view") -> tuple[int, bytes]:
    """One GET with exactly this Host header (None: none); (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        head = f"GET {path} HTTP/1.0\r\n" + (f"Host: {host}\r\n" if host is not None else "")
        conn.sendall((head + "\r\n").encode())
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    return status, reply.split(b"\r\n\r\n", 1)[1]


def test_twelve_hundred_slow_connections_cannot_stop_the_web_server_answering(home):
    """One account opens 1,200 connections that each send half a request and then nothing
    (slowloris), then resets them all: a real browser's request is still answered, and the
    server's stderr holds no traceback."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < SLOW + 100:
        pytest.skip(f"needs {SLOW + 100} file descriptors (the hard limit is {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, SLOW + 100), hard))
    proc, port = _web(home)
    slow: list[socket.socket] = []
    try:
        for _ in range(SLOW):
            conn = socket.create_connection(("127.0.0.1", port), timeout=30)
            try:
                conn.sendall(b"GET /api/view HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            except OSError:       # already closed for a newer one: that is the point
                pass
            slow.append(conn)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/view", timeout=60).read()
        assert json.loads(body)["banner"]["level"] == "never"
        for conn in slow:         # all reset at once, mid-request
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
        slow.clear()
        assert _ask(port, "127.0.0.1")[0] == 200
    finally:
        for conn in slow:
            conn.close()
        err = _stop(proc)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "Traceback" not in err and len(err) < 1000, err[-2000:]


def test_a_request_for_a_name_the_server_was_not_given_is_refused(home):
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 (or at the
    SSH tunnel's end) makes the browser ask with `Host: evil.example:PORT`; it gets 421 and
    no data. IP addresses, localhost and the names given with --host-name are answered."""
    proc, port = _web(home, "--host-name", "gpu-lab.example.org")
    try:
        for host in (f"evil.example:{port}", "evil.example", "gpu-lab.example.org.evil.example",
                     "localhost.evil.example", None):
            status, body = _ask(port, host)
            assert status == 421 and b"banner" not in body, (host, status, body)
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", f"[::1]:{port}",
                     f"GPU-lab.example.org:{port}", "gpu-lab.example.org."):
            status, body = _ask(port, host)
            assert status == 200 and json.loads(body)["banner"]["level"] == "never", host
        assert _ask(port, "evil.example", "/")[0] == 421
    finally:
        err = _stop(proc)
    assert "Traceback" not in err


def test_many_clients_fetching_the_view_cost_the_controller_one_read_per_poll_interval(home):
    """Eight browsers (or fetch loops) each ask for /api/view every second for 30 s (of the
    server's clock): the real controller answers one status and one job list per poll
    interval (10 s here), not one per second as before (30 of each)."""
    from iadeep_cli.controller.runtime import Controller
    from iadeep_cli.inventory import Inventory
    from iadeep_cli.web.server import Snapshots, serve

    seed.seed_state_dir("busy")
    ctl = Controller(Inventory(nodes=()), home, clock=lambda: seed.NOW)
    asked: Counter[str] = Counter()
    answer = ctl.service.handle

    def counted(op, args, user):
        asked[op] += 1
        return answer(op, args, user)

    ctl.service.handle = counted
    ready = threading.Event()
    thread = threading.Thread(target=ctl.run, args=(ready.set,), daemon=True)
    thread.start()
    assert ready.wait(30)
    now = [0.0]
    server = serve("127.0.0.1", 0, snapshots=Snapshots(clock=lambda: now[0]))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/view"
    try:
        with ThreadPoolExecutor(8) as browsers:
            for second in range(30):
                now[0] = float(second)
                views = list(browsers.map(
                    lambda _: json.loads(urllib.request.urlopen(url, timeout=60).read()),
                    range(8)))
                assert all(v["live"] and v["queue"] for v in views)   # the controller's
        interval = views[0]["refresh_s"]
        assert interval == 10
        most = math.ceil(30 / interval)
        assert 1 <= asked["list"] <= most and 1 <= asked["status"] <= most, asked
    finally:
        server.shutdown()
        server.server_close()
        ctl.stop()
        thread.join(30)

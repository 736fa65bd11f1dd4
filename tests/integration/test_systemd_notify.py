"""The controller under systemd's `Type=notify` and `WatchdogSec=`: a real Unix datagram socket
stands where systemd's would be ($NOTIFY_SOCKET), and a real controller process tells it when
it is ready, pings the watchdog from its rounds, and says when it stops (sd_notify(3))."""
from __future__ import annotations

import os
import socket
import time

from helpers.controllers import ControllerProcess


def _messages(sock: socket.socket, until: float) -> list[str]:
    got = []
    while time.monotonic() < until:
        sock.settimeout(max(0.05, until - time.monotonic()))
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    return got


def test_the_controller_says_ready_pings_the_watchdog_each_period_and_says_stopping(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    ctl = ControllerProcess(tmp_path / "state", env={"NOTIFY_SOCKET": str(path),
                                                     "WATCHDOG_USEC": "1000000"})
    try:
        ctl.start()   # its socket answers: READY was sent before that
        seen = _messages(sock, time.monotonic() + 4.0)
        assert seen[0].startswith("READY=1\nSTATUS=serving ") and \
            seen[0].endswith("controller.sock"), seen
        pings = [m for m in seen[1:] if m == "WATCHDOG=1"]
        # a ping at most every half period (0.5 s) from the rounds (poll every 10 s by
        # default, so a ping after each round): at least one in 4 s, never a flood
        assert 1 <= len(pings) <= 9, seen
    finally:
        ctl.stop()
    assert "STOPPING=1" in _messages(sock, time.monotonic() + 5.0)
    sock.close()


def test_a_watchdog_meant_for_another_process_is_not_pinged(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    ctl = ControllerProcess(tmp_path / "state", env={
        "NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000",
        "WATCHDOG_PID": str(os.getpid())})   # this test's pid, not the controller's
    try:
        ctl.start()
        seen = _messages(sock, time.monotonic() + 2.0)
    finally:
        ctl.stop()
    sock.close()
    assert seen and seen[0].startswith("READY=1") and "WATCHDOG=1" not in seen, seen

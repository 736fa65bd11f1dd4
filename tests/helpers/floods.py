"""Hostile clients for the controller's socket and metrics port: run as another account
(``helpers.accounts.AsUser``) by the tests and by benchmarks/bench_isolation.py. Each holds
its attack until a byte arrives on ``stop_r`` and says so on ``ready_w`` once it is on."""
from __future__ import annotations

import collections
import os
import resource
import select
import socket
import threading
from collections.abc import Callable

# What the controller says to a connection it drops for sending nothing (server.py).
TIMED_OUT = "no complete request within"


def connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))   # blocking: waits while the listen backlog is full
    s.settimeout(60)
    return s


def reply_of(s: socket.socket) -> str:
    """Everything the controller sends on ``s`` until it closes it (a reset, not an end of
    file, when it closes with part of the request unread)."""
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data.decode(errors="replace")


def _room_for(n: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 512), hard))


def idle_connections(path: str, n: int) -> dict[int, socket.socket]:
    """``n`` open connections that send nothing, by file descriptor (the open-file limit
    raised to hold them)."""
    _room_for(n)
    live = {}
    for _ in range(n):
        s = connect(path)
        live[s.fileno()] = s
    return live


def keep_open(path: str, live: dict[int, socket.socket], stop_r: int,
              classify: Callable[[str], str]) -> collections.Counter:
    """Wait on the ``live`` idle connections until told to stop (a byte on ``stop_r``) and
    every one is closed: each the controller drops is read to its end and counted under
    ``classify(reply)``; one classified "timed out" (dropped for idling) is reopened while
    not told to stop, so the controller's places stay full."""
    poller = select.poll()
    for fd in (*live, stop_r):
        poller.register(fd, select.POLLIN)
    seen: collections.Counter = collections.Counter()
    stopping = False
    while live:
        for fd, _ in poller.poll(200):
            poller.unregister(fd)
            if fd == stop_r:
                stopping = True
                continue
            s = live.pop(fd)
            reply = reply_of(s)
            s.close()
            kind = classify(reply)
            seen[kind] += 1
            if kind == "timed out" and not stopping:
                s = connect(path)
                live[s.fileno()] = s
                poller.register(s, select.POLLIN)
    return seen


def hold_idle(path: str, n: int, ready_w: int, stop_r: int) -> dict:
    """Keep ``n`` idle connections open (reopening each one dropped for idling) until told to
    stop; what the controller answered them: refused / timed out / other."""
    live = idle_connections(path, n)
    os.write(ready_w, b"r")
    return dict(keep_open(path, live, stop_r, _idle_reply))


def _idle_reply(reply: str) -> str:
    return ("refused" if "connections to the controller open" in reply else
            "timed out" if TIMED_OUT in reply else "other")


UPLOAD_HEAD = b'{"op": "add", "args": {"script_b64": "' + b"A" * 2**20   # 1 MiB, no end


def stall_uploads(path: str, n: int, ready_w: int, stop_r: int) -> int:
    """Keep ``n`` submissions stalled part way: each sends 1 MiB (past the small requests, so
    the controller reads on only in an upload place) and then nothing, and is reopened when
    the controller drops it. Says ready once one has been read that far; returns how many
    were."""
    read: list[int] = []
    stop = threading.Event()

    def one() -> None:
        while not stop.is_set():
            s = connect(path)
            try:
                s.sendall(UPLOAD_HEAD)
                read.append(1)
                if len(read) == 1:
                    os.write(ready_w, b"r")
                while not stop.is_set() and not select.select([s], [], [], 0.2)[0]:
                    pass
            except OSError:
                pass
            finally:
                s.close()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    os.read(stop_r, 1)
    stop.set()
    for t in threads:
        t.join(30)
    return len(read)


def read_history(path: str, n: int, ready_w: int, stop_r: int) -> int:
    """``n`` clients each asking for the longest page of every job (``queue list --all
    --limit 10000``) back to back until told to stop; how many answers they read."""
    from iadeep_cli.controller import client

    stop = threading.Event()
    answers: list[int] = []

    def loop() -> None:
        while not stop.is_set():
            client.call("list", {"all_states": True, "limit": 10000}, socket_path=path,
                        timeout=120)
            answers.append(1)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    os.write(ready_w, b"r")
    os.read(stop_r, 1)
    stop.set()
    for t in threads:
        t.join(120)
    return len(answers)

"""The EOF after a command's input goes out under the channel's lock (``ssh._shutdown_write``).

paramiko's own ``shutdown_write`` builds the EOF under the lock and sends it after; a command
that ends at once let paramiko's transport thread close the channel in between, and sshd then
dropped the whole connection for an EOF on a freed channel ("ieof packet referred to
nonexistent channel"), cutting every command in flight. The end-to-end check is
tests/integration/test_node_untrusted_sshd.py::test_thirty_concurrent_reads_keep_the_connection_up
(it lost a read this way about once in seven runs under load); this pins the ordering."""
from __future__ import annotations

import threading

from iadeep_cli.nodes.ssh import _shutdown_write


class _Transport:
    def __init__(self, lock: threading.Lock):
        self.lock, self.sent = lock, []

    def _send_user_message(self, m) -> None:
        self.sent.append((m, self.lock.locked()))


class _Channel:
    """Just the parts of ``paramiko.Channel`` the EOF goes through."""

    def __init__(self, closing: bool = False):
        self.lock = threading.Lock()
        self.transport = _Transport(self.lock)
        self.eof_sent = closing   # paramiko marks it when its transport thread closes the channel

    def _send_eof(self):
        if self.eof_sent:
            return None
        self.eof_sent = True
        return "EOF"


def test_the_eof_is_sent_under_the_channels_lock():
    chan = _Channel()
    _shutdown_write(chan)
    assert chan.transport.sent == [("EOF", True)]


def test_no_eof_once_the_channel_is_closing():
    chan = _Channel(closing=True)
    _shutdown_write(chan)
    assert chan.transport.sent == []

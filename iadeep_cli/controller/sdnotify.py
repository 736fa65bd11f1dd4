"""systemd's service notifications (``Type=notify``, ``WatchdogSec=``), without libsystemd.

Under systemd with ``Type=notify`` the service manager passes ``$NOTIFY_SOCKET``, a Unix
datagram socket; the controller sends ``READY=1`` once its socket answers (so `systemctl start`
returns when clients can connect, and units ordered after it start then), ``WATCHDOG=1`` after
each scheduling round (``$WATCHDOG_USEC`` set by ``WatchdogSec=``: a controller whose rounds hang
stops pinging and systemd restarts it), and ``STOPPING=1`` when it stops. The pings come from the
round itself, not a timer thread, so a hung round is what systemd sees. Anywhere else (no
``$NOTIFY_SOCKET``) every call does nothing. The protocol is sd_notify(3)'s.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)


class SystemdNotifier:
    def __init__(self, environ: Mapping[str, str] = os.environ,
                 clock=time.monotonic) -> None:
        path = environ.get("NOTIFY_SOCKET", "")
        # an abstract socket is written with a leading "@"
        self._address = "\0" + path[1:] if path.startswith("@") else path
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())   # the watchdog is meant for this process
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and mine else None
        self._clock = clock
        self._pinged_at = float("-inf")
        self._warned = False

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def ready(self, status: str = "") -> None:
        self._send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def round_done(self) -> None:
        """A round ended: ping the watchdog, at most twice a watchdog period (as sd_notify(3)
        advises), so a fast poll interval costs no more datagrams than needed."""
        if self.watchdog_s is None:
            return
        now = self._clock()
        if now - self._pinged_at >= self.watchdog_s / 2:
            self._pinged_at = now
            self._send("WATCHDOG=1")

    def _send(self, message: str) -> None:
        if not self._address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(message.encode(), self._address)
        except OSError as exc:   # never the controller's end; said once
            if not self._warned:
                log.warning("cannot notify systemd on %s: %s", self._address.lstrip("\0"), exc)
                self._warned = True

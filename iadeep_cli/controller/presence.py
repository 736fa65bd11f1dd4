"""When each interactive job's (`run --pty`) owner was last heard from: noted by the service
(a log read, keystrokes: through its port, ``requests/port.ControllerPort.heard``) and read by
the round (``round/steps/limits.py`` stops a job not heard from for ``lab.interactive_grace``).
Shared by both rooms, so it imports neither."""
from __future__ import annotations

import threading
from collections.abc import Iterable


class Presence:
    """When each interactive job's owner was last heard from (a log read or keystrokes), by
    the controller's clock; shared by the socket's threads and the scheduling loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[int, float] = {}

    def heard(self, job_id: int, now: float) -> None:
        with self._lock:
            self._seen[job_id] = max(now, self._seen.get(job_id, now))

    def silent_for(self, job_id: int, now: float) -> float:
        """Seconds since the owner of ``job_id`` was last heard from; 0 the first time a job
        is asked about (its grace starts then: after a controller restart, for instance)."""
        with self._lock:
            last = self._seen.setdefault(job_id, now)
        return max(0.0, now - last)

    def keep_only(self, job_ids: Iterable[int]) -> None:
        """Forget the jobs not in ``job_ids`` (those that ended)."""
        keep = set(job_ids)
        with self._lock:
            for job_id in [j for j in self._seen if j not in keep]:
                del self._seen[job_id]

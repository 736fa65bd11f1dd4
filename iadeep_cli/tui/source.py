"""Where the monitor's data comes from: the controller's read views, never a node.

``fetch`` is what the refresh worker calls off the UI thread; ``act`` sends cancel/hold/release
through the controller exactly like ``iadeep queue cancel`` does, so the controller applies the
same permission checks (its peer-credential user, not anything the TUI claims).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..checks import escaped  # names and reasons other users typed: never raw to the terminal
from ..controller import client

LOG_TAIL_BYTES = 16384


@dataclass(frozen=True)
class MonitorData:
    """One refresh: the status view, the unfinished jobs and how stale both are.

    ``stale_since`` follows ``client.read``: None when the controller answered, else its last
    heartbeat time (0.0: it never ran with this state directory).
    """

    status: dict
    jobs: list = field(default_factory=list)
    stale_since: float | None = None


def fetch() -> MonitorData:
    """Status plus the job list, from the controller or (when it is down) the database."""
    status, stale = client.read("status")
    jobs, stale_jobs = client.read("list", {"all_states": False, "owner": None})
    if stale is None:        # the controller may have died between the two reads
        stale = stale_jobs
    return MonitorData(status=escaped(status), jobs=escaped(list(jobs)), stale_since=stale)


def show(job_id: int) -> tuple[dict, float | None]:
    """A job's fields and events (same view as ``iadeep queue show``)."""
    job, stale = client.read("show", {"id": job_id})
    return escaped(job), stale


def log_tail(job_id: int, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The end of a job's log, read by the controller; raises IadeepError if it cannot.

    The controller's ``logs`` op reads forward from ``offset``; when its reply says how large
    the log is (``size``) and we got only the head, we ask again for the last ``max_bytes``.
    """
    reply = client.call("logs", {"id": job_id, "offset": 0, "max_bytes": max_bytes})
    size = reply.get("size")
    if isinstance(size, int) and size > max_bytes:
        reply = client.call("logs", {"id": job_id, "offset": size - max_bytes,
                                     "max_bytes": max_bytes})
    return str(reply.get("data") or "")


def act(op: str, ids: list[int]) -> list[dict]:
    """cancel / hold / release through the controller: [{id, state} | {id, error}]."""
    return client.call(op, {"ids": list(ids)})

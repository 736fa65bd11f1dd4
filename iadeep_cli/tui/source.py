"""Where the monitor's data comes from: the controller's read views, never a node.

``fetch`` is what the refresh worker calls off the UI thread; ``act`` sends cancel/hold/release
through the controller exactly like ``iadeep queue cancel`` does, so the controller applies the
same permission checks (its peer-credential user, not anything the TUI claims).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import messages as m
from ..checks import escaped  # names and reasons other users typed: never raw to the terminal
from ..controller import client

LOG_TAIL_BYTES = 16384


@dataclass(frozen=True)
class MonitorData:
    """One refresh: the status view, the unfinished jobs and how stale both are.

    ``stale_since`` follows ``client.read``: None when the controller answered, else its last
    heartbeat time (0.0: it never ran with this state directory).
    """

    status: m.StatusView
    jobs: list[m.JobView] = field(default_factory=list)
    stale_since: float | None = None


def fetch() -> MonitorData:
    """Status plus the job list, from the controller or (when it is down) the database."""
    status, stale = client.read(m.StatusRequest())
    jobs, stale_jobs = client.read(m.ListRequest(all_states=False, owner=None))
    if stale is None:        # the controller may have died between the two reads
        stale = stale_jobs
    return MonitorData(escaped(status), escaped(jobs), stale)


def show(job_id: int) -> tuple[m.JobDetail, float | None]:
    """A job's fields and events (same view as ``iadeep queue show``)."""
    detail, stale = client.read(m.ShowRequest(job_id))
    return escaped(detail), stale


def log_tail(job_id: int, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The end of a job's log, read by the controller; raises IadeepError if it cannot.

    The controller's ``logs`` op reads forward from ``offset``; when its reply says how large
    the log is (``size``) and we got only the head, we ask again for the last ``max_bytes``.
    """
    chunk = client.ask(m.LogsRequest(job_id, 0, max_bytes))
    if chunk.size is not None and chunk.size > max_bytes:
        chunk = client.ask(m.LogsRequest(job_id, chunk.size - max_bytes, max_bytes))
    return chunk.data


def act(request: m.JobsRequest) -> list[m.JobActionResult]:
    """cancel / hold / release through the controller: each job's new state or its error."""
    return client.ask(request)

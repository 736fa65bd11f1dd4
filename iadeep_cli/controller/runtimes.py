"""The lab's run times as placement learns them, and a job's run-time estimate from them.

The scheduling round reads the lab's history (``history``) every ``REFRESH_S`` and passes it to
``plan()`` (``durations=``); ``queue why`` reads the same history the same way and shows the
estimate placement makes of the job from it (``estimate``: ``scheduler.remaining``'s
``estimate_runtime``, per user and label, capped by ``--time``).
"""
from __future__ import annotations

import sqlite3

from ..jobs import FINISHED, Job, JobState
from ..messages import RuntimeView
from ..scheduler.remaining import Durations, estimate_runtime
from ..store import jobrows

# the last 30 days' finished jobs (one indexed query, at most 5000 of them), re-read by the
# round at most every 10 minutes
WINDOW_S = 30 * 86400.0
REFRESH_S = 600.0


def history(conn: sqlite3.Connection, now: float) -> Durations:
    """The lab's recent run times per label and per user."""
    return Durations(jobrows.run_times(conn, now - WINDOW_S))


def estimate(job: Job, durations: Durations, now: float) -> RuntimeView | None:
    """How long ``job`` is expected to run in all (None for a finished job): what placement
    estimates from its owner's and its label's history, its ``--time`` and, running, its
    age."""
    if job.state in FINISHED:
        return None
    age = now - job.started_at if job.state == JobState.RUNNING and job.started_at else 0.0
    est = estimate_runtime(durations, user=job.owner, workload=job.spec.workload,
                           time_limit_s=job.spec.time_limit_s, age_s=age)
    return RuntimeView(est.seconds, est.low_s, est.high_s, est.source)

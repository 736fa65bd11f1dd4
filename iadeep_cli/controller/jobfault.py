"""A job's files never fail a round: what one job wrote fails only that job's measurements.

Whatever a job writes on its node (progress lines, its log, its exit file, an out-of-memory
line) is untrusted input read by the round's steps: observe (progress), the ends of an attempt
(exit code, out-of-memory naming, an --output that could not be opened), idle and reconcile.
Each step reads it one job at a time through ``guarded``: an error while working on one job's
data (a bug its bytes found, an overflow) is logged with the job's id and owner, and only that
job's part of the step is skipped this round (its speed unmeasured, its failure unnamed); every
other job, and the round, go on. What is not a job's fault is not swallowed: the state
database failing (``StoreError``, ``sqlite3.Error``) stops the round as before, and
``runtime.Controller`` reports a round that fails (``iadeep status``, the metrics).
"""
from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import StoreError
from ..jobs import Job

log = logging.getLogger("iadeep.controller")
T = TypeVar("T")
_LOGGED_MAX = 10_000   # (job, what) pairs whose first fault was logged in full


class JobFaults:
    """How many job-data faults were skipped, and which were logged already (the first of each
    job and step in full, with its traceback; the same fault again each round at debug)."""

    def __init__(self) -> None:
        self.count = 0
        self._logged: set[tuple[int, str]] = set()

    def guarded(self, job: Job, what: str, default: T, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, or ``default`` when it fails on ``job``'s data (logged, naming the
        job)."""
        try:
            return fn(*args)
        except (StoreError, sqlite3.Error):
            raise   # the database's failure, not the job's: the round's
        except Exception as exc:
            self.count += 1
            key = (job.id, what)
            if key in self._logged:
                log.debug("job %d (%s): %s skipped again: %s: %s", job.id, job.owner, what,
                          type(exc).__name__, exc)
                return default
            if len(self._logged) >= _LOGGED_MAX:
                self._logged.clear()
            self._logged.add(key)
            log.error("job %d (%s): %s failed on what the job wrote (%s: %s); only this "
                      "job's %s is skipped, the round goes on", job.id, job.owner, what,
                      type(exc).__name__, str(exc)[:200], what, exc_info=True)
            return default


FAULTS = JobFaults()   # the controller's one record (the metrics read its count)


def guarded(job: Job, what: str, default: T, fn: Callable[..., T], *args: Any) -> T:
    """``FAULTS.guarded``: ``fn(*args)``, or ``default`` when it fails on ``job``'s data."""
    return FAULTS.guarded(job, what, default, fn, *args)

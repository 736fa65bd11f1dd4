"""What one job wrote fails only that job's part of a step (``controller/jobfault.py``): the
error is logged naming the job, its default stands in, and the next job is served; a database
failure is not a job's and still stops the round."""
from __future__ import annotations

import logging
import sqlite3

import pytest

from iadeep_cli.controller.jobfault import JobFaults
from iadeep_cli.errors import StoreError
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.progress import rate


def _job(job_id: int, owner: str) -> Job:
    return Job(id=job_id, owner=owner, spec=JobSpec(script="/x.sh"), state=JobState.RUNNING,
               submitted_at=0.0, node="n1", gpu_indices=(0,))


def _speed(points: list) -> float | None:
    return rate(points)   # on points a job's bytes made: a str where a count belongs raises


def test_a_fault_in_one_jobs_data_skips_only_that_job_and_names_it(caplog):
    faults = JobFaults()
    bad, good = _job(7, "mallory"), _job(8, "alice")
    caplog.set_level(logging.DEBUG, "iadeep.controller")
    got = [faults.guarded(j, "progress measurement", None, _speed, pts) for j, pts in
           ((bad, [(0.0, 0), (1.0, "x")]), (good, [(0.0, 0), (2.0, 10)]))]
    assert got == [None, 5.0] and faults.count == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].getMessage().startswith(
        "job 7 (mallory): progress measurement failed on what the job wrote (TypeError: ")
    faults.guarded(bad, "progress measurement", None, _speed, [(0.0, 0), (1.0, "x")])
    assert faults.count == 2   # counted again, logged in full once
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


@pytest.mark.parametrize("error", [StoreError("disk full"), sqlite3.OperationalError("locked")])
def test_a_database_failure_is_the_rounds_not_the_jobs(error):
    def fails() -> None:
        raise error

    with pytest.raises(type(error)):
        JobFaults().guarded(_job(1, "alice"), "reconcile", None, fails)

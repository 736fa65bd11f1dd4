"""The pure rules behind --after/--after-any/--after-fail and --array: parsing, when a
dependency is met or can never be, and how `queue list` folds an array's waiting tasks."""
from __future__ import annotations

import pytest

from iadeep_cli.cli.queue import _ranges
from iadeep_cli.errors import InputError
from iadeep_cli.jobs import JobSpec, JobState, parse_array, parse_job_ids, validate_spec
from iadeep_cli.scheduler.depends import check

S = JobState


def test_array_indices_as_sbatch_writes_them():
    assert parse_array("0-3").indices == (0, 1, 2, 3) and parse_array("0-3").limit is None
    assert parse_array("5,1,3").indices == (1, 3, 5)
    assert parse_array("0-9:4,2%3") == parse_array(" 0-9:4,2 %3".replace(" ", ""))
    assert parse_array("0-9:4,2%3").indices == (0, 2, 4, 8) and parse_array("0-9%3").limit == 3
    assert len(parse_array("0-9999").indices) == 10_000


@pytest.mark.parametrize("text, says", [
    ("", "not a list"), ("a-b", "not a list"), ("3-1", "ascending"), ("0-3%0", "after %"),
    ("0-3%x", "after %"), ("0-10000", "more than 10000 tasks"), ("1-2,-3", "not a list"),
    ("0-3:0", "ascending")])
def test_a_bad_array_is_one_clear_error(text, says):
    with pytest.raises(InputError, match=says):
        parse_array(text)
    with pytest.raises(InputError):
        validate_spec(JobSpec(script="/x.sh", array=text))


def test_job_id_lists():
    assert parse_job_ids("12", "--after") == (12,)
    assert parse_job_ids("12, 13", "--after") == (12, 13)
    for bad in ("", "12,", "x", "-1", "0"):
        with pytest.raises(InputError, match="not a list of job ids"):
            parse_job_ids(bad, "--after")


def _spec(**deps) -> JobSpec:
    return JobSpec(script="/x.sh", **deps)


def test_after_waits_for_success_and_never_starts_after_another_end():
    assert check(_spec(after=(1, 2)), {1: S.SUCCEEDED, 2: S.SUCCEEDED}) == (None, None)
    assert check(_spec(after=(1, 2)), {1: S.SUCCEEDED, 2: S.RUNNING}) == \
        ("waiting for job 2 (running)", None)
    assert check(_spec(after=(1,)), {1: S.LOST}) == ("waiting for job 1 (lost)", None)
    for end, says in ((S.FAILED, "failed"), (S.CANCELLED, "was cancelled"),
                      (S.TIMEOUT, "timed out")):
        # one end that can never be undone decides, whatever the others still do
        assert check(_spec(after=(1, 2)), {1: S.QUEUED, 2: end}) == \
            (None, f"dependency 2 {says}")


def test_after_fail_and_after_any():
    for end in (S.FAILED, S.CANCELLED, S.TIMEOUT):
        assert check(_spec(after_fail=(1,)), {1: end}) == (None, None)
        assert check(_spec(after_any=(1,)), {1: end}) == (None, None)
    assert check(_spec(after_fail=(1,)), {1: S.SUCCEEDED}) == \
        (None, "dependency 1 succeeded (it was --after-fail)")
    assert check(_spec(after_any=(1,)), {1: S.SUCCEEDED}) == (None, None)
    assert check(_spec(after_any=(1, 2, 3, 4, 5)), dict.fromkeys(range(1, 6), S.QUEUED)) == \
        ("waiting for jobs 1 (queued), 2 (queued), 3 (queued) and 2 more", None)
    assert check(_spec(after_any=(7,)), {}) == (None, "dependency 7 does not exist")


def test_folded_indices_read_as_ranges():
    assert _ranges([3, 4, 5, 9, 11, 12]) == "3-5,9,11-12"
    assert _ranges([0]) == "0"

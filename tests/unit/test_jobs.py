"""Job options as a user writes them: ``--time`` in Slurm's formats, checked and printed back."""
from __future__ import annotations

import pytest

from iadeep_cli.errors import InputError
from iadeep_cli.jobs import JobSpec, parse_signal, parse_time_limit, validate_spec
from iadeep_cli.text import hms


@pytest.mark.parametrize("text, seconds", [
    ("90", 5400), ("0:30", 30), ("90:30", 5430), ("2:00:00", 7200), ("1:02:03", 3723),
    ("3-0", 3 * 86400), ("1-12", 86400 + 12 * 3600), ("1-12:30", 86400 + 12 * 3600 + 1800),
    ("1-0:0:5", 86405), (" 45 ", 2700),
])
def test_time_limits_in_sbatch_formats(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "1h", "-5", "1:2:3:4", "1-", "2.5", "1-2-3"])
def test_a_time_limit_that_is_not_one_names_the_formats(text):
    with pytest.raises(InputError) as err:
        parse_time_limit(text)
    assert "is not a time limit" in err.value.message and "2:00:00" in err.value.hint


@pytest.mark.parametrize("seconds", [0, -1, 366 * 86400])
def test_a_time_limit_out_of_range_is_refused(seconds):
    with pytest.raises(InputError, match="--time must be more than 0"):
        validate_spec(JobSpec(script="/x.sh", time_limit_s=seconds))


def test_time_limits_print_as_slurm_prints_them():
    assert [hms(s) for s in (None, 59, 7200, 3723, 86400, 3 * 86400 + 5)] == \
        ["-", "0:00:59", "2:00:00", "1:02:03", "1-00:00:00", "3-00:00:05"]


@pytest.mark.parametrize("text, parsed", [
    ("USR1", ("USR1", 60)), ("usr2@120", ("USR2", 120)), ("SIGTERM@0", ("TERM", 0)),
    ("HUP@5", ("HUP", 5)),
])
def test_signals_as_sbatch_takes_them(text, parsed):
    assert parse_signal(text) == parsed


@pytest.mark.parametrize("text", ["KILL@60", "STOP", "USR1@", "USR1@-5", "USR1@1.5", "9", ""])
def test_a_signal_a_job_cannot_catch_or_a_bad_one_is_refused(text):
    with pytest.raises(InputError, match="is not SIGNAL"):
        validate_spec(JobSpec(script="/x.sh", time_limit_s=60, signal=text))
def test_notify_takes_only_its_four_words():
    for when in ("end", "fail", "all", "none"):
        validate_spec(JobSpec(script="/x.sh", notify=when))
    with pytest.raises(InputError, match="--notify must be one of end, fail, all, none, got 'END'"):
        validate_spec(JobSpec(script="/x.sh", notify="END"))

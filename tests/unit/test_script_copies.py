"""The controller's copies of submitted scripts: one member's are bounded (a clear one-line
refusal, nothing of the job kept), others' submissions go on, and a copy is freed once its
jobs ended the retention ago. The real service, store (SQLite) and files on disk; the limits
are made small so that a test reaches them in a few submissions."""
from __future__ import annotations

import pytest

from helpers.service_lab import service_lab, submit
from iadeep_cli.controller import copies
from iadeep_cli.errors import InputError
from iadeep_cli.jobs import JobState
from iadeep_cli.store import jobrows, scripts

S = JobState


@pytest.fixture
def lab(tmp_path):
    with service_lab(tmp_path) as (store, service):
        yield store, service, tmp_path


def _add(service, tmp_path, user="alice", size=100, **spec) -> int:
    script = tmp_path / "train.sh"
    script.write_bytes(b"#!/bin/sh\n" + b"#" * (size - 11) + b"\n")
    return submit(service, user, script, **spec)


def _copies(tmp_path) -> set[str]:
    return {p.name for p in (tmp_path / "scripts").iterdir()}


def test_one_members_huge_scripts_are_refused_past_the_quota(lab, monkeypatch):
    store, service, tmp_path = lab
    monkeypatch.setattr(scripts, "BYTES_PER_USER", 12 * 2**20)
    big = 4 * 2**20 - 64                                      # just under the largest script
    kept = [_add(service, tmp_path, size=big) for _ in range(3)]
    with pytest.raises(InputError) as refused:
        _add(service, tmp_path, size=big)
    assert "\n" not in refused.value.message
    assert refused.value.message.startswith("alice has 3 script copies (12.0 MiB) kept by the "
                                            "controller, the most one member may have is")
    assert "--array" in refused.value.hint
    with store.tx() as c:                                      # nothing of it was kept
        assert [j.id for j in jobrows.select(c)] == kept
    assert _copies(tmp_path) == {str(i) for i in kept}
    other = _add(service, tmp_path, user="bob", size=big)      # others are not held up
    assert str(other) in _copies(tmp_path)


def test_very_many_small_scripts_are_refused_and_an_array_is_one_copy(lab, monkeypatch):
    store, service, tmp_path = lab
    monkeypatch.setattr(scripts, "COPIES_PER_USER", 5)
    array = _add(service, tmp_path, array="0-99")              # 100 tasks, one copy
    for _ in range(4):
        _add(service, tmp_path)
    with pytest.raises(InputError, match="alice has 5 script copies"):
        _add(service, tmp_path)
    with store.tx() as c:
        assert scripts.usage(c, "alice")[0] == 5 and len(jobrows.array_tasks(c, array)) == 100


def test_a_copy_is_freed_once_all_its_jobs_ended_the_retention_ago(lab, monkeypatch):
    store, service, tmp_path = lab
    monkeypatch.setattr(scripts, "COPIES_PER_USER", 2)
    single = _add(service, tmp_path)
    array = _add(service, tmp_path, array="0-1")
    with pytest.raises(InputError):
        _add(service, tmp_path)
    with store.tx() as c:
        tasks = [j.id for j in jobrows.array_tasks(c, array)]
        for job_id, ended in ((single, 2000.0), (tasks[0], 2000.0)):   # the array's 2nd runs on
            jobrows.transition(c, job_id, S.CANCELLED, "cancelled", "alice", ended,
                               ended_at=ended)
    retention = 3600.0
    assert copies.free(store, tmp_path / "scripts", retention, 2000.0 + retention - 1) == []
    assert copies.free(store, tmp_path / "scripts", retention, 2000.0 + retention) == [single]
    assert _copies(tmp_path) == {str(array)}                   # a task still needs it
    with store.tx() as c:
        jobrows.transition(c, tasks[1], S.CANCELLED, "cancelled", "alice", 3000.0,
                           ended_at=3000.0)
    assert copies.free(store, tmp_path / "scripts", retention, 3000.0 + retention) == [array]
    assert _copies(tmp_path) == set()
    _add(service, tmp_path)                                    # room again
    with store.tx() as c:
        assert scripts.usage(c, "alice")[0] == 1


def test_while_the_lab_total_runs_short_finished_copies_are_freed_after_a_day(lab):
    """Past half of lab.script_copies_gib, a finished job's copy is freed a day after it
    ended instead of after job_dir_retention (7 days); below half, the retention holds."""
    store, service, tmp_path = lab
    done = [_add(service, tmp_path, size=2**20) for _ in range(2)]
    with store.tx() as c:
        for job_id in done:
            jobrows.transition(c, job_id, S.CANCELLED, "cancelled", "alice", 2000.0,
                               ended_at=2000.0)
    week, day = 7 * 86400.0, scripts.PRESSED_RETENTION_S
    roomy = 8 * 2**20                                          # 2 MiB held: a quarter
    assert copies.free(store, tmp_path / "scripts", week, 2000.0 + day, roomy) == []
    short = 3 * 2**20                                          # 2 MiB held: two thirds
    assert copies.free(store, tmp_path / "scripts", week, 2000.0 + day - 1, short) == []
    assert copies.free(store, tmp_path / "scripts", week, 2000.0 + day, short) == done
    assert _copies(tmp_path) == set()

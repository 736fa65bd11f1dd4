"""SQLite store: migrations, the job state machine and its event history."""
import dataclasses
import json
import sqlite3

import pytest

from iadeep_cli.errors import InvalidTransition, NotFoundError, StoreError
from iadeep_cli.jobs import TRANSITIONS, Attempt, JobSpec, JobState
from iadeep_cli.store import Store, db, jobrows as jobs


def test_fresh_database_is_wal_and_current(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION


def test_upgrade_from_first_version_keeps_jobs(tmp_path):
    path = tmp_path / "old.db"
    conn = db.connect(path, migrate_to=1)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.execute("INSERT INTO jobs (owner, script, state, submitted_at, args) "
                 "VALUES ('alice', '/a.sh', 'queued', 1.0, '[\"x\"]')")
    conn.close()
    store = Store(path)
    with store.tx() as c:
        job = jobs.get(c, 1)
        assert c.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
        # Columns added by later migrations exist with their defaults.
        assert job.owner == "alice" and job.spec.args == ("x",)
        assert job.cancel_requested_by is None and job.orphans == ()
        assert job.observed_speed is None
        c.execute("SELECT * FROM profiles").fetchall()


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={db.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this iadeep"):
        Store(path)


def test_every_transition_is_checked_and_recorded(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as c:
        job_id, _ = jobs.insert(c, "bob", JobSpec(script="/j.sh"), 10.0)
        jobs.transition(c, job_id, JobState.HELD, "hold", "bob", 11.0)
        with pytest.raises(InvalidTransition, match="job 1 is held; it cannot become running"):
            jobs.transition(c, job_id, JobState.RUNNING, "nope", "ctl", 12.0)
        jobs.transition(c, job_id, JobState.QUEUED, "release", "bob", 13.0)
        jobs.transition(c, job_id, JobState.STARTING, "placed", "ctl", 14.0, node="n",
                        gpu_indices=(0, 1))
        jobs.transition(c, job_id, JobState.RUNNING, "started", "ctl", 15.0)
        job = jobs.transition(c, job_id, JobState.SUCCEEDED, "exit 0", "ctl", 16.0, exit_code=0)
        assert job.gpu_indices == (0, 1) and job.exit_code == 0
        history = [(e["old_state"], e["new_state"]) for e in jobs.events(c, job_id)]
    assert history == [(None, "queued"), ("queued", "held"), ("held", "queued"),
                       ("queued", "starting"), ("starting", "running"),
                       ("running", "succeeded")]


@pytest.mark.parametrize("old", list(JobState))
def test_state_machine_refuses_everything_not_listed(tmp_path, old):
    from iadeep_cli.jobs import check_transition
    for new in JobState:
        if new in TRANSITIONS[old]:
            check_transition(1, old, new)
        else:
            with pytest.raises(InvalidTransition):
                check_transition(1, old, new)


def test_finished_states_are_final():
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert TRANSITIONS[state] == frozenset()


def test_client_token_makes_submission_idempotent(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as c:
        first = jobs.insert(c, "a", JobSpec(script="/j.sh"), 1.0, token="t1")
        again = jobs.insert(c, "a", JobSpec(script="/j.sh"), 2.0, token="t1")
        other = jobs.insert(c, "a", JobSpec(script="/j.sh"), 3.0, token="t2")
        assert first == (1, True) and again == (1, False) and other == (2, True)
        assert len(jobs.select(c)) == 2


def test_unknown_job(tmp_path):
    with Store(tmp_path / "s.db").tx() as c, pytest.raises(NotFoundError, match="no job with id 9"):
        jobs.get(c, 9)


def test_rollback_on_error_leaves_nothing_half_done(tmp_path):
    store = Store(tmp_path / "s.db")
    with pytest.raises(RuntimeError), store.tx() as c:
        jobs.insert(c, "a", JobSpec(script="/j.sh"), 1.0)
        raise RuntimeError("crash mid-transaction")
    with store.tx() as c:
        assert jobs.select(c) == []
        assert c.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0


def test_a_spec_field_without_a_column_round_trips_through_extra(tmp_path):
    """Job options added after the first schema need no migration: they live in ``extra``."""
    store = Store(tmp_path / "db.sqlite")
    spec = JobSpec(script="/x.sh", time_limit_s=5400.0)
    with store.tx() as c:
        job_id, _ = jobs.insert(c, "alice", spec, 1.0)
        plain_id, _ = jobs.insert(c, "alice", JobSpec(script="/x.sh"), 1.0)
        assert json.loads(c.execute("SELECT extra FROM jobs WHERE id=?", (plain_id,))
                          .fetchone()[0]) == {}          # defaults are not stored
        # a field written by a newer iadeep is left out, not an error
        c.execute("UPDATE jobs SET extra=json_set(extra, '$.spec.future', 1) WHERE id=?",
                  (job_id,))
        assert jobs.get(c, job_id).spec == spec
        assert jobs.get(c, plain_id).spec.time_limit_s is None
    store.close()


def test_an_arrays_tasks_are_found_by_index_not_by_reading_every_job(tmp_path):
    """`queue show 12_3` and `cancel 12` look an array's tasks up by its id: the query must use
    the jobs_array index (v8), or each lookup reads every job's JSON."""
    store = Store(tmp_path / "s.db")
    with store.tx() as c:
        first, _ = jobs.insert(c, "alice", JobSpec("/a.sh"), 1.0)
        for index in range(3):
            task, _ = jobs.insert(c, "alice", JobSpec("/t.sh"), 2.0 + index)
            c.execute("UPDATE jobs SET extra = json_set(COALESCE(extra, '{}'), "
                      "'$.array_id', ?, '$.array_index', ?) WHERE id = ?", (first, index, task))
        assert [t.array_index for t in jobs.array_tasks(c, first)] == [0, 1, 2]
        assert jobs.array_tasks(c, 999) == []
        plan = " ".join(r[3] for r in c.execute(
            f"EXPLAIN QUERY PLAN SELECT * FROM jobs WHERE {jobs.ARRAY_ID} = ? ORDER BY id", (1,)))
        assert "USING INDEX jobs_array" in plan, plan
    store.close()


def test_run_times_are_the_recent_finished_jobs_per_label_and_user(tmp_path):
    store = Store(tmp_path / "s.db")
    ends = {"succeeded": 1000.0, "failed": 2000.0, "timeout": 3000.0, "cancelled": 4000.0}
    with store.tx() as c:
        for k, (state, end) in enumerate(ends.items()):
            job_id, _ = jobs.insert(c, "bob", JobSpec(script="/j.sh", workload=f"w{k}",
                                                      time_limit_s=600.0 if k == 1 else None),
                                    0.0)
            jobs.update(c, job_id, state=state, started_at=end - 100.0 * (k + 1),
                        ended_at=end)
        old, _ = jobs.insert(c, "bob", JobSpec(script="/j.sh", workload="old"), 0.0)
        jobs.update(c, old, state="succeeded", started_at=0.0, ended_at=10.0)
        jobs.insert(c, "bob", JobSpec(script="/j.sh", workload="q"), 0.0)   # still queued
        got = jobs.run_times(c, since=500.0)
    # newest first, with the --time of those that had one; cancelled jobs and those that
    # ended before `since` say nothing
    assert got == [("w2", 300.0, "bob", None), ("w1", 200.0, "bob", 600.0),
                   ("w0", 100.0, "bob", None)]


def test_requeue_drops_the_whole_attempt_and_counts_only_one_that_may_have_run(tmp_path):
    """``jobs.requeue`` is the one way back to the queue: every field of ``Attempt`` is
    cleared; an attempt that may have run leaves its node as an orphan and stays counted, one
    that provably never ran does not count."""
    store = Store(tmp_path / "s.db")
    placed = {"node": "n1", "gpu_indices": (0, 1), "attempts": 1}
    ran = Attempt(node="n1", gpu_indices=(0, 1), remote_pid=4242, remote_start=99,
                  started_at=12.0, signalled=True, suspended_at=13.0, suspended_for=7,
                  suspended_s=5.0, checkpoint_at=14.0)
    assert {f.name for f in dataclasses.fields(Attempt)} == set(jobs.no_attempt())
    with store.tx() as c:
        i, _ = jobs.insert(c, "alice", JobSpec(script="/a.sh", retries=2), 1.0)
        jobs.transition(c, i, JobState.STARTING, "placed", "controller", 2.0, **placed)
        jobs.transition(c, i, JobState.RUNNING, "ran", "controller", 3.0,
                        **dataclasses.asdict(ran))
        assert jobs.get(c, i).attempt == ran
        back = jobs.requeue(c, i, "retry", "controller", 20.0, started=True)
        assert back.state == JobState.QUEUED and back.attempt == Attempt()
        assert (back.orphans, back.attempts) == (("n1",), 1)
        jobs.transition(c, i, JobState.STARTING, "placed", "controller", 21.0,
                        **{**placed, "node": "n2", "attempts": 2})
        never = jobs.requeue(c, i, "launch did not happen", "controller", 22.0, started=False)
        assert never.attempt == Attempt() and (never.orphans, never.attempts) == (("n1",), 1)
        assert [e["new_state"] for e in jobs.events(c, i)][-1] == "queued"
        with pytest.raises(InvalidTransition):   # checked like any transition
            jobs.requeue(c, i, "again", "controller", 23.0, started=False)


def test_decoded_rows_are_reused_only_while_every_column_is_unchanged(tmp_path):
    """The controller's round reads the same jobs many times: an unchanged row gives back the
    job decoded before, any change to any column (an ``extra`` field included) a fresh one, and
    a job no longer read is forgotten at the next sweep."""
    store = Store(tmp_path / "s.db")
    decoded = jobs.Decoded()
    with store.tx() as c:
        a, _ = jobs.insert(c, "a", JobSpec(script="/a.sh"), 1.0)
        b, _ = jobs.insert(c, "a", JobSpec(script="/b.sh"), 1.0)
        first = jobs.select(c, decoded=decoded)
        again = jobs.select(c, decoded=decoded)
        assert [x is y for x, y in zip(first, again)] == [True, True]
        # what accounting writes every poll is no part of a job: no fresh decoding for it
        c.execute("UPDATE jobs SET work_s = work_s + 5, acct_at = 9.0, acct_rate = '{}'")
        assert all(x is y for x, y in zip(first, jobs.select(c, decoded=decoded)))
        jobs.transition(c, a, JobState.STARTING, "placed", "t", 2.0, node="n1",
                        gpu_indices=(0,))
        c.execute("UPDATE jobs SET extra=json_set(extra, '$.signalled', 1) WHERE id=?", (b,))
        changed = jobs.select(c, decoded=decoded)
        assert changed[0].state is JobState.STARTING and changed[0].node == "n1"
        assert changed[1].signalled and not first[1].signalled
        assert changed == jobs.select(c)   # the same values as decoding afresh
        decoded.sweep()
        jobs.select(c, states={JobState.STARTING}, decoded=decoded)
        decoded.sweep()   # b was not read since the last sweep: forgotten
        assert jobs.select(c, decoded=decoded)[1] is not changed[1]
    store.close()


def test_the_rounds_same_question_is_read_again_only_after_a_job_changed(tmp_path):
    """A step asking what an earlier step of the round asked gets the last answer only while no
    job changed: through the controller's connection or by another connection's commit, every
    such write makes the next question a fresh read.  A write rolled back, what accounting
    rewrites every poll and the nodes' snapshots change no job: the answer stands."""
    from iadeep_cli.controller.round.context import Context

    store = Store(tmp_path / "s.db")
    ctx = Context(store=store, inventory=None, pool=None, actions=None,  # type: ignore[arg-type]
                  clock=lambda: 5.0)
    reads: list[str] = []
    store._conn.set_trace_callback(
        lambda sql: reads.append(sql) if "FROM jobs WHERE state IN" in sql else None)
    queued = {JobState.QUEUED}
    with store.tx() as c:
        a, _ = jobs.insert(c, "a", JobSpec(script="/a.sh"), 1.0)
    assert [j.id for j in ctx.jobs(queued)] == [a] and len(reads) == 1
    assert [j.id for j in ctx.jobs(iter([JobState.QUEUED]))] == [a] and len(reads) == 1
    ctx.jobs(queued).clear()   # an answer handed out is the caller's to change
    assert [j.id for j in ctx.jobs(queued)] == [a] and len(reads) == 1
    ctx.jobs({JobState.RUNNING})   # another question: a read of its own
    assert len(reads) == 2

    with store.tx() as c:   # a write through the controller's connection
        b, _ = jobs.insert(c, "a", JobSpec(script="/b.sh"), 2.0)
    assert [j.id for j in ctx.jobs(queued)] == [a, b] and len(reads) == 3

    with pytest.raises(RuntimeError), store.tx() as c:   # a write rolled back
        jobs.transition(c, a, JobState.CANCELLED, "cancel", "a", 3.0)
        raise RuntimeError("rolled back")
    assert [j.id for j in ctx.jobs(queued)] == [a, b] and len(reads) == 3
    with store.tx() as c:   # accounting's and the poll's writes: no job changed
        c.execute("UPDATE jobs SET work_s = work_s + 1, acct_at = 4.0, acct_rate = '{}'")
        c.execute("INSERT INTO node_snapshots (node, taken_at, data) VALUES ('n1', 4.0, '{}')")
    assert [j.id for j in ctx.jobs(queued)] == [a, b] and len(reads) == 3
    with store.tx() as c:   # one job changed: a fresh read, which sees it
        jobs.transition(c, a, JobState.CANCELLED, "cancel", "a", 4.5)
    assert [j.id for j in ctx.jobs(queued)] == [b] and len(reads) == 4

    other = sqlite3.connect(tmp_path / "s.db")   # another process's commit
    other.execute("UPDATE jobs SET name='renamed' WHERE id=?", (b,))
    other.commit()
    other.close()
    assert ctx.jobs(queued)[0].spec.name == "renamed" and len(reads) == 5
    assert len(ctx.jobs(queued)) == 1 and len(reads) == 5
    ctx.decoded.sweep()   # a new round: what no job changed since is still answered
    assert [j.id for j in ctx.jobs(queued)] == [b] and len(reads) == 5
    ctx.decoded.sweep()
    ctx.decoded.sweep()   # a question not asked for a whole round is forgotten
    assert [j.id for j in ctx.jobs(queued)] == [b] and len(reads) == 6
    store.close()


def test_every_column_a_job_is_read_from_counts_as_a_change(tmp_path):
    """The count the round's kept answers depend on (``jobrows.version``) moves with a write
    that changes any column a ``Job`` is decoded from, an insert and a delete, by any
    connection, and with nothing else (a value written as it was included): a column added to
    the decoding but not to the trigger fails here."""
    store = Store(tmp_path / "s.db")
    with store.tx() as c:
        a, _ = jobs.insert(c, "a", JobSpec(script="/a.sh"), 1.0)
    columns = [name.strip() for name in jobs._JOB_COLUMNS.split(",")]
    table = {r["name"] for r in store._conn.execute("PRAGMA table_info(jobs)")}
    assert set(columns) <= table
    store._conn.execute("PRAGMA foreign_keys=OFF")   # the id too (its events point to it)
    changed = ("CASE WHEN {c} IS NULL THEN 0 WHEN typeof({c}) = 'text' AND json_valid({c}) "
               "THEN json_array({c}) WHEN typeof({c}) = 'text' THEN {c} || 'x' "
               "ELSE {c} + 1 END")   # the JSON columns stay JSON (an index reads one)
    for column in columns:
        with store.tx() as c:
            before = jobs.version(c)
            c.execute(f"UPDATE jobs SET {column} = {column} WHERE id = ?", (a,))
            assert jobs.version(c) == before, f"{column} written as it was"
            c.execute(f"UPDATE jobs SET {column} = {changed.format(c=column)} WHERE id = ?",
                      (a,))
            assert jobs.version(c) == before + 1, column
            a = c.execute("SELECT max(id) FROM jobs").fetchone()[0]   # id moved
    for column in sorted(table - set(columns)):   # accounting's, the token: no job change
        with store.tx() as c:
            before = jobs.version(c)
            c.execute(f"UPDATE jobs SET {column} = {column} WHERE id = ?", (a,))
            assert jobs.version(c) == before, column
    with store.tx() as c:
        before = jobs.version(c)
    other = sqlite3.connect(tmp_path / "s.db")   # another connection's insert and delete
    other.execute("INSERT INTO jobs (owner, script, state, submitted_at) "
                  "VALUES ('b', '/b.sh', 'queued', 2.0)")
    other.execute("DELETE FROM jobs WHERE owner = 'b'")
    other.commit()
    other.close()
    with store.tx() as c:
        assert jobs.version(c) == before + 2
    store.close()

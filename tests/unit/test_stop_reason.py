"""Why a job is being stopped is a value (``jobs.StopReason``) in a column of its own, and
``cancel_requested_by`` names people only: a database written before (schema v13, the
controller's reasons as fake user names) is carried over."""
from __future__ import annotations

import json

from iadeep_cli.jobs import JobSpec, JobState, StopReason
from iadeep_cli.store import db, jobrows, outbox


def test_each_stop_reason_leads_to_its_state():
    assert StopReason.TIME_LIMIT.to_state() is JobState.TIMEOUT
    assert {r.to_state() for r in StopReason if r is not StopReason.TIME_LIMIT} == \
        {JobState.CANCELLED}
    assert [r for r in StopReason if r.requeues] == [StopReason.IDLE_REQUEUE]


def test_an_older_database_moves_the_controllers_reasons_out_of_the_user_names(tmp_path):
    path = tmp_path / "iadeep.db"
    conn = db.connect(path, migrate_to=13)
    ids = {}
    for who in ("dave", "iadeep:time-limit", "iadeep:idle", "iadeep:idle-requeue",
                "iadeep:client-gone", None):
        job_id, _ = jobrows.insert(conn, "alice", JobSpec("/bin/true"), 0.0)
        extra = {"cancel_requested_by": who} if who else {}
        if who == "iadeep:idle":
            extra["idle_since"] = 5.0
        conn.execute("UPDATE jobs SET state='running', extra=?, reason=? WHERE id=?",
                     (json.dumps(extra), "idle: GPU n1:0 at or below 5% for 30m"
                      if who == "iadeep:idle" else "", job_id))
        conn.execute("INSERT INTO events (job_id, at, old_state, new_state, reason, actor) "
                     "VALUES (?, 1.0, 'running', 'running', ?, 'controller')",
                     (job_id, "idle: GPU n1:0 at or below 5% for 30m" if who == "iadeep:idle"
                      else "busy again after being idle"))
        ids[who] = job_id
    db.migrate(conn, 13)
    jobs = {who: jobrows.get(conn, i) for who, i in ids.items()}
    assert {who: (j.cancel_requested_by, j.stop_reason) for who, j in jobs.items()} == {
        "dave": ("dave", StopReason.CANCELLED),
        "iadeep:time-limit": (None, StopReason.TIME_LIMIT),
        "iadeep:idle": (None, StopReason.IDLE),
        "iadeep:idle-requeue": (None, StopReason.IDLE_REQUEUE),
        "iadeep:client-gone": (None, StopReason.CLIENT_GONE),
        None: (None, None)}
    assert [j.idle_marked for j in jobs.values()] == [False, False, True, False, False, False]
    kinds = {e.job_id: e.kind for e in outbox.events_after(conn)}
    assert kinds == {i: (jobrows.IDLE if who == "iadeep:idle" else None)
                     for who, i in ids.items()}
    conn.close()


def test_a_stop_reason_is_written_and_read_back_and_counts_as_a_change(tmp_path):
    conn = db.connect(tmp_path / "iadeep.db")
    job_id, _ = jobrows.insert(conn, "alice", JobSpec("/bin/true"), 0.0)
    before = jobrows.version(conn)
    jobrows.update(conn, job_id, stop_reason=StopReason.TIME_LIMIT)
    assert jobrows.get(conn, job_id).stop_reason is StopReason.TIME_LIMIT
    assert jobrows.version(conn) > before   # the round's cached reads see it
    conn.close()

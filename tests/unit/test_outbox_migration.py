"""One outbox (schema v16): a database written before, with a job notifications table and a
foreign-spell messages table, is carried over row by row, delivery state included; the new
table keeps each kind queued once; and the one delivery loop sends both kinds."""
from __future__ import annotations

import sqlite3

import pytest

from helpers.sinks import HookSink
from iadeep_cli.controller.notify import Notifier
from iadeep_cli.jobs import JobSpec
from iadeep_cli.settings import NotifySettings
from iadeep_cli.store import Store, db, foreign, jobrows, outbox

# (id, job, event, kind, state, channel, created, attempts, next_at, sent, gave up, error)
JOB_NOTES = [
    (1, 0, 11, "start", "running", "webhook", 10.0, 1, 10.0, 12.0, None, ""),
    (2, 0, 12, "end", "failed", "email", 20.0, 0, 20.0, None, None, ""),
    (3, 0, 12, "end", "failed", "webhook", 20.0, 2, 95.0, None, None, "HTTP 500"),
    (5, 1, 13, "array_end", "failed", "email", 30.0, 5, 30.0, None, 40.0, "refused"),
]
# (spell, channel, recipient, created, attempts, next_at, sent, gave up, error)
SPELL_NOTES = [
    ("webhook", "", 50.0, 0, 50.0, None, None, ""),
    ("email", "alice", 50.0, 1, 70.0, None, None, "timed out"),
    ("email", "bob", 50.0, 1, 51.0, 51.0, None, ""),
]


def _v15(path) -> tuple[sqlite3.Connection, list[int], int]:
    """A database at schema v15 with both old outboxes filled in."""
    conn = db.connect(path, migrate_to=15)
    jobs = [jobrows.insert(conn, "alice", JobSpec("/bin/true"), 0.0)[0] for _ in range(2)]
    for note in JOB_NOTES:
        conn.execute("INSERT INTO notifications (id, job_id, event_id, kind, state, channel, "
                     "created_at, attempts, next_at, sent_at, gave_up_at, error) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (note[0], jobs[note[1]], *note[2:]))
    spell = foreign.add(conn, "n1", 0, 4242, "python3", 2048.0, 0.0, 50.0)
    for note in SPELL_NOTES:
        conn.execute("INSERT INTO foreign_notes (foreign_id, channel, recipient, created_at, "
                     "attempts, next_at, sent_at, gave_up_at, error) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (spell, *note))
    return conn, jobs, spell


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_every_queued_message_of_both_old_outboxes_moves_with_its_delivery_state(tmp_path):
    conn, jobs, spell = _v15(tmp_path / "iadeep.db")
    db.migrate(conn, 15)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    assert {"notifications", "foreign_notes"}.isdisjoint(_tables(conn))
    moved = [(r["id"], r["job_id"], r["event_id"], r["kind"], r["state"], r["channel"],
              r["created_at"], r["attempts"], r["next_at"], r["sent_at"], r["gave_up_at"],
              r["error"])
             for job in jobs for r in outbox.for_job(conn, job)]
    assert moved == [(n[0], jobs[n[1]], *n[2:]) for n in JOB_NOTES]   # ids kept
    spells = outbox.for_spell(conn, spell)
    assert [(r["kind"], r["channel"], r["recipient"], r["created_at"], r["attempts"],
             r["next_at"], r["sent_at"], r["gave_up_at"], r["error"]) for r in spells] == \
        [("foreign_idle", *n) for n in SPELL_NOTES]
    assert min(r["id"] for r in spells) > max(n[0] for n in JOB_NOTES)
    # what is still owed, of both kinds, in the order of its next try
    due = outbox.due(conn, 1000.0, "email")
    assert [(n.kind, n.job_id, n.foreign_id, n.recipient) for n in due] == [
        ("end", jobs[0], None, ""), ("foreign_idle", None, spell, "alice")]
    assert outbox.next_due(conn, "webhook") == 50.0
    conn.close()


def test_the_one_outbox_queues_each_event_and_each_spell_message_once(tmp_path):
    conn, jobs, spell = _v15(tmp_path / "iadeep.db")
    db.migrate(conn, 15)
    event = outbox.Event(12, jobs[0], "running", "failed")
    outbox.enqueue(conn, event, "end", "email", 99.0)            # queued before the upgrade
    outbox.enqueue_spell(conn, spell, "email", "alice", 99.0)    # likewise
    outbox.enqueue_spell(conn, spell, "email", "carol", 99.0)    # a new admin: one more
    assert len(outbox.for_job(conn, jobs[0])) == 3
    assert [r["recipient"] for r in outbox.for_spell(conn, spell)] == \
        ["", "alice", "bob", "carol"]
    with pytest.raises(sqlite3.IntegrityError):   # a message is about a job or a spell
        conn.execute("INSERT INTO outbox (kind, channel, created_at, next_at) "
                     "VALUES ('end', 'email', 0, 0)")
    conn.close()


def test_one_delivery_loop_sends_a_jobs_notification_and_the_admins_message(tmp_path):
    conn, jobs, spell = _v15(tmp_path / "iadeep.db")
    conn.close()
    store = Store(tmp_path / "iadeep.db")   # opening it upgrades it
    try:
        with HookSink() as hook:
            notifier = Notifier(store, NotifySettings(webhook=hook.url), clock=lambda: 100.0)
            assert notifier.deliver("webhook") == 2   # the job's end (due at 95) and the spell's
            events = [body.get("event") for body in hook.accepted]
            assert events == ["foreign_idle", "end"]   # by when each was due: 50, then 95
            assert notifier.deliver("webhook") == 0
        with store.tx() as c:
            assert all(r["sent_at"] == 100.0 for r in outbox.for_spell(c, spell)
                       if r["channel"] == "webhook")
            assert [r["sent_at"] for r in outbox.for_job(c, jobs[0])] == [12.0, None, 100.0]
    finally:
        store.close()

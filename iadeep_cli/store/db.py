"""The SQLite database: connection settings and schema migrations.

WAL mode lets read-only views read while the controller writes; ``synchronous=FULL`` makes a
commit durable before the controller replies "accepted" to a client, so a job once accepted
survives a SIGKILL or power cut. The schema is versioned with ``PRAGMA user_version``: each entry
of ``MIGRATIONS`` moves it up by one, so a database from any older iadeep upgrades in place.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from ..errors import StoreError

# The columns a job is decoded from when v13 was made (``store.jobrows._JOB_COLUMNS``): a write
# that changes one of their values counts (one that writes a value as it was does not: the
# round rewrites each running job's observed speed, mostly unchanged).
_V13_JOB_COLUMNS = (
    "id", "owner", "state", "submitted_at", "started_at", "ended_at", "node", "gpu_indices",
    "exit_code", "attempts", "remote_pid", "remote_start", "reason", "observed_speed",
    "predicted_speed", "extra", "script", "args", "name", "gpus", "mem_gib", "workload",
    "priority", "exclusive", "workdir", "env", "retries", "min_speed")

_V14_JOB_COLUMNS = (*_V13_JOB_COLUMNS, "stop_reason")

MIGRATIONS: tuple[str, ...] = (
    # v1: jobs and their transition history.
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        client_token TEXT UNIQUE,
        owner TEXT NOT NULL,
        name TEXT NOT NULL DEFAULT '',
        script TEXT NOT NULL,
        args TEXT NOT NULL DEFAULT '[]',
        workdir TEXT,
        env TEXT NOT NULL DEFAULT '[]',
        gpus INTEGER NOT NULL DEFAULT 1,
        mem_gib REAL,
        workload TEXT,
        priority INTEGER NOT NULL DEFAULT 0,
        exclusive INTEGER NOT NULL DEFAULT 0,
        retries INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL,
        submitted_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        node TEXT,
        gpu_indices TEXT NOT NULL DEFAULT '[]',
        exit_code INTEGER,
        attempts INTEGER NOT NULL DEFAULT 0,
        remote_pid INTEGER,
        reason TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX jobs_state ON jobs(state);
    CREATE INDEX jobs_owner ON jobs(owner);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        at REAL NOT NULL,
        old_state TEXT,
        new_state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        actor TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX events_job ON events(job_id);
    """,
    # v2: what the controller last saw of each node, and small key/value facts (heartbeat).
    """
    CREATE TABLE node_snapshots (
        node TEXT PRIMARY KEY,
        taken_at REAL NOT NULL,
        data TEXT NOT NULL,
        down_since REAL
    );
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # v3: interference data measured in this lab, and per-job speeds for the model and the TUI.
    """
    ALTER TABLE jobs ADD COLUMN min_speed REAL;
    ALTER TABLE jobs ADD COLUMN predicted_speed REAL;
    ALTER TABLE jobs ADD COLUMN observed_speed REAL;
    ALTER TABLE jobs ADD COLUMN extra TEXT NOT NULL DEFAULT '{}';
    CREATE TABLE profiles (
        gpu_model TEXT NOT NULL,
        workload TEXT NOT NULL,
        data TEXT NOT NULL,
        source TEXT NOT NULL DEFAULT 'measured',
        updated_at REAL NOT NULL,
        PRIMARY KEY (gpu_model, workload)
    );
    CREATE TABLE colocations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        gpu_model TEXT NOT NULL,
        jobs TEXT NOT NULL,
        speeds TEXT NOT NULL,
        samples INTEGER NOT NULL DEFAULT 1,
        observed_at REAL NOT NULL
    );
    """,
    # v4: the job's session leader is identified by pid AND start time, recorded at launch, so
    # a job that rewrites or deletes its own pid file cannot hide or fake its state.
    """
    ALTER TABLE jobs ADD COLUMN remote_start INTEGER;
    """,
    # v5: where each learnt profile came from (one row per job sample, kept or rejected), and
    # admins' pins (a pinned profile is never changed by learning).
    """
    ALTER TABLE profiles ADD COLUMN pinned_by TEXT;
    ALTER TABLE profiles ADD COLUMN pinned_at REAL;
    CREATE TABLE profile_samples (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        gpu_model TEXT NOT NULL,
        workload TEXT NOT NULL,
        data TEXT NOT NULL,
        job_id INTEGER,
        owner TEXT,
        at REAL NOT NULL,
        accepted INTEGER NOT NULL,
        note TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX profile_samples_key ON profile_samples(gpu_model, workload, id);
    """,
    # v6: notifications waiting to be sent (an outbox), one row per job event and channel, and
    # how far the events were read for them. The cursor starts at the newest event, so an
    # upgraded lab is not told about jobs that ended before it could ask for notifications.
    """
    CREATE TABLE notifications (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        event_id INTEGER NOT NULL,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        channel TEXT NOT NULL,
        created_at REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,
        sent_at REAL,
        gave_up_at REAL,
        error TEXT NOT NULL DEFAULT ''
    );
    CREATE UNIQUE INDEX notifications_once ON notifications(event_id, channel);
    CREATE INDEX notifications_due ON notifications(channel, sent_at, gave_up_at, next_at);
    INSERT INTO meta (key, value) SELECT 'notify_cursor', COALESCE(MAX(id), 0) FROM events;
    """,
    # v7: accounting kept on the job row as it happens (store/impact.py), so `iadeep report`
    # is one aggregate over the jobs, not a pass over every event: seconds holding GPUs over
    # all attempts and since when it holds them now, its first start, the work it did
    # (exclusive-GPU-seconds, and how much of it measured), its share of the busy GPUs' time,
    # its time and work while sharing, its energy; the rate it accrues at from ``acct_at``.
    # ``usage``: the same totals per minute (last two days) or hour, for any time window.
    # Existing jobs get their held time and first start from their events (as the report
    # computed them before); work is recorded from now on.
    """
    ALTER TABLE jobs ADD COLUMN held_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN held_since REAL;
    ALTER TABLE jobs ADD COLUMN first_started_at REAL;
    ALTER TABLE jobs ADD COLUMN work_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN measured_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN busy_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN shared_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN shared_work_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN energy_j REAL;
    ALTER TABLE jobs ADD COLUMN acct_at REAL;
    ALTER TABLE jobs ADD COLUMN acct_rate TEXT;
    CREATE INDEX jobs_ended ON jobs(ended_at);
    CREATE TABLE usage (
        span INTEGER NOT NULL,
        start REAL NOT NULL,
        busy_s REAL NOT NULL DEFAULT 0,
        work_s REAL NOT NULL DEFAULT 0,
        measured_s REAL NOT NULL DEFAULT 0,
        energy_j REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (span, start)
    );
    UPDATE jobs SET
        held_since = CASE WHEN state IN ('starting', 'running') THEN
            (SELECT MAX(e.at) FROM events e WHERE e.job_id = jobs.id
             AND e.new_state IN ('starting', 'running')
             AND (e.old_state IS NULL OR e.old_state NOT IN ('starting', 'running')))
            END,
        first_started_at = (SELECT MIN(e.at) FROM events e WHERE e.job_id = jobs.id
                            AND e.new_state = 'starting');
    UPDATE jobs SET held_s = COALESCE(
        (SELECT SUM(CASE WHEN e.old_state IN ('starting', 'running') THEN e.at ELSE 0 END)
              - SUM(CASE WHEN e.new_state IN ('starting', 'running') THEN e.at ELSE 0 END)
         FROM events e WHERE e.job_id = jobs.id) + COALESCE(held_since, 0),
        CASE WHEN state IN ('starting', 'running') THEN 0 ELSE ended_at - started_at END, 0);
    UPDATE jobs SET first_started_at = started_at WHERE first_started_at IS NULL
        AND started_at IS NOT NULL;
    UPDATE jobs SET held_since = started_at WHERE held_since IS NULL
        AND state IN ('starting', 'running')
    """,
    # v8: an array's tasks by their array id (`queue show 12_3`, `cancel 12`, dependencies on
    # an array) without reading every job's JSON: an index on the expression the queries use
    # (store/jobrows.ARRAY_ID), only over the jobs that are array tasks.
    """
    CREATE INDEX jobs_array ON jobs(json_extract(extra, '$.array_id'))
        WHERE json_extract(extra, '$.array_id') IS NOT NULL
    """,
    # v9: a profile sample's kind: 'job' (a job profiled alone, merged by the outlier rule) or
    # 'phase' (a running job's phase change: it replaces the profile, and later samples are
    # judged against it and the ones after it only).
    """
    ALTER TABLE profile_samples ADD COLUMN kind TEXT NOT NULL DEFAULT 'job'
    """,
    # v10: reservations (`iadeep reserve add`): GPUs an admin keeps for a user over a window
    # (store/reservations.py, scheduler/reservations.py).
    """
    CREATE TABLE reservations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        user TEXT NOT NULL,
        gpus INTEGER NOT NULL,
        node TEXT,
        start REAL NOT NULL,
        end REAL NOT NULL,
        created_by TEXT NOT NULL,
        created_at REAL NOT NULL
    )
    """,
    # v11: the controller's copies of submitted scripts (one per job, one per array), their
    # owner and size, so one member's copies are bounded (store/scripts.py) and each is freed
    # once its jobs ended ``job_dir_retention`` ago. Copies taken before this version are
    # listed with an unknown size (0) so that they are freed the same way.
    """
    CREATE TABLE script_copies (
        job_id INTEGER PRIMARY KEY REFERENCES jobs(id),
        owner TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_at REAL NOT NULL,
        freed_at REAL
    );
    CREATE INDEX script_copies_owner ON script_copies(owner, freed_at);
    INSERT INTO script_copies (job_id, owner, bytes, created_at)
        SELECT id, owner, 0, submitted_at FROM jobs
        WHERE json_extract(extra, '$.array_id') IS NULL
           OR json_extract(extra, '$.array_id') = id
    """,
    # v12: GPU processes iadeep did not start that held a GPU idle past lab.idle_after (one
    # row a spell, ended_at set when it ends) and the messages owed to the admins about each,
    # kept until sent or given up like the job notifications (store/foreign.py).
    """
    CREATE TABLE foreign_idle (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node TEXT NOT NULL,
        gpu INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        name TEXT NOT NULL DEFAULT '',
        mib REAL,
        since REAL NOT NULL,
        marked_at REAL NOT NULL,
        ended_at REAL
    );
    CREATE INDEX foreign_idle_open ON foreign_idle(ended_at);
    CREATE TABLE foreign_notes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        foreign_id INTEGER NOT NULL REFERENCES foreign_idle(id),
        channel TEXT NOT NULL,
        recipient TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        next_at REAL NOT NULL,
        sent_at REAL,
        gave_up_at REAL,
        attempts INTEGER NOT NULL DEFAULT 0,
        error TEXT NOT NULL DEFAULT '',
        UNIQUE (foreign_id, channel, recipient)
    )
    """,
    # v13: a count of the changes to what a job is decoded from (every column a ``Job`` is
    # read from; not the accounting columns each poll rewrites), kept by triggers on every
    # connection's writes: the controller answers a question it asked before from its last
    # answer while this count is unchanged (``store.jobrows.version``).
    """
    CREATE TABLE job_rows_changed (n INTEGER NOT NULL);
    INSERT INTO job_rows_changed (n) VALUES (0);
    CREATE TRIGGER job_rows_inserted AFTER INSERT ON jobs
    BEGIN UPDATE job_rows_changed SET n = n + 1; END;
    CREATE TRIGGER job_rows_deleted AFTER DELETE ON jobs
    BEGIN UPDATE job_rows_changed SET n = n + 1; END;
    CREATE TRIGGER job_rows_updated AFTER UPDATE OF """ + ", ".join(_V13_JOB_COLUMNS) + """
    ON jobs WHEN """ + " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _V13_JOB_COLUMNS) + """
    BEGIN UPDATE job_rows_changed SET n = n + 1; END;
    """,
    # v14 (structure, issue 44): why a job on a node is being stopped, as a value in a column
    # of its own (``jobs.StopReason``), instead of a fake user name in ``cancel_requested_by``
    # ("iadeep:time-limit", "iadeep:idle", "iadeep:idle-requeue", "iadeep:client-gone"), which
    # now names people only;
    # the column is counted by the job-change trigger like every column a job is read from. An
    # idle job's events are told apart by a kind (``events.kind``: 'idle'), not their text.
    """
    ALTER TABLE jobs ADD COLUMN stop_reason TEXT;
    UPDATE jobs SET stop_reason = CASE json_extract(extra, '$.cancel_requested_by')
        WHEN 'iadeep:time-limit' THEN 'time-limit'
        WHEN 'iadeep:idle' THEN 'idle'
        WHEN 'iadeep:idle-requeue' THEN 'idle-requeue'
        WHEN 'iadeep:client-gone' THEN 'client-gone'
        ELSE 'cancelled' END
        WHERE json_extract(extra, '$.cancel_requested_by') IS NOT NULL;
    UPDATE jobs SET extra = json_remove(extra, '$.cancel_requested_by')
        WHERE json_extract(extra, '$.cancel_requested_by') LIKE 'iadeep:%';
    UPDATE jobs SET extra = json_set(extra, '$.idle_marked', json('true'))
        WHERE json_extract(extra, '$.idle_since') IS NOT NULL AND reason LIKE 'idle:%';
    ALTER TABLE events ADD COLUMN kind TEXT;
    UPDATE events SET kind = 'idle'
        WHERE old_state = 'running' AND new_state = 'running' AND reason LIKE 'idle:%';
    DROP TRIGGER job_rows_updated;
    CREATE TRIGGER job_rows_updated AFTER UPDATE OF """ + ", ".join(_V14_JOB_COLUMNS) + """
    ON jobs WHEN """ + " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _V14_JOB_COLUMNS) + """
    BEGIN UPDATE job_rows_changed SET n = n + 1; END;
    """,
    # v15 (issue 41): a co-location row is one member's word until another member's jobs agree, or
    # an admin adopts it, as a phase profile is (store/profiles.py): ``owners`` the users whose
    # jobs reported it (comma-separated, sorted), ``kind`` 'held' (that word only, used by no fit
    # or replay) or 'lab' (agreed or adopted: the model's and self-tuning's), ``note`` where it
    # came from. Rows from before were recorded as the lab's: they stay 'lab', with no owners
    # (`iadeep profile pairs` lists them for an admin to review).
    """
    ALTER TABLE colocations ADD COLUMN owners TEXT NOT NULL DEFAULT '';
    ALTER TABLE colocations ADD COLUMN kind TEXT NOT NULL DEFAULT 'lab';
    ALTER TABLE colocations ADD COLUMN note TEXT NOT NULL DEFAULT '';
    CREATE INDEX colocations_kind ON colocations(kind, gpu_model)
    """,
    # v16 (structure, issue 44): one outbox for every message owed (store/outbox.py), instead
    # of one table a kind with the same delivery columns: a job's notifications (a row per
    # event and channel: ``event_id``, ``job_id``, ``state``) and the admins' messages about a
    # foreign process holding a GPU idle (a row per spell, channel and admin: ``foreign_id``,
    # ``recipient``). Every row of both old tables moves over with its delivery state (sent,
    # given up, tries, the next try), the job notifications keeping their ids; then they go.
    """
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        channel TEXT NOT NULL,
        job_id INTEGER REFERENCES jobs(id),
        event_id INTEGER,
        state TEXT NOT NULL DEFAULT '',
        foreign_id INTEGER REFERENCES foreign_idle(id),
        recipient TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,
        sent_at REAL,
        gave_up_at REAL,
        error TEXT NOT NULL DEFAULT '',
        CHECK ((job_id IS NULL) != (foreign_id IS NULL))
    );
    CREATE UNIQUE INDEX outbox_event_once ON outbox(event_id, channel)
        WHERE event_id IS NOT NULL;
    CREATE UNIQUE INDEX outbox_spell_once ON outbox(foreign_id, channel, recipient)
        WHERE foreign_id IS NOT NULL;
    CREATE INDEX outbox_due ON outbox(channel, sent_at, gave_up_at, next_at);
    CREATE INDEX outbox_job ON outbox(job_id, kind, channel);
    INSERT INTO outbox (id, kind, channel, job_id, event_id, state, created_at, attempts,
                        next_at, sent_at, gave_up_at, error)
        SELECT id, kind, channel, job_id, event_id, state, created_at, attempts, next_at,
               sent_at, gave_up_at, error FROM notifications ORDER BY id;
    INSERT INTO outbox (kind, channel, foreign_id, recipient, created_at, attempts, next_at,
                        sent_at, gave_up_at, error)
        SELECT 'foreign_idle', channel, foreign_id, recipient, created_at, attempts, next_at,
               sent_at, gave_up_at, error FROM foreign_notes ORDER BY id;
    DROP TABLE notifications;
    DROP TABLE foreign_notes
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def connect(path: Path, *, readonly: bool = False, migrate_to: int = SCHEMA_VERSION
            ) -> sqlite3.Connection:
    """Open (and, unless read-only, create and migrate) the database at ``path``."""
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10,
                                   check_same_thread=False)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=30, check_same_thread=False,
                                   isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys=ON")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open the state database: {exc}",
                         hint="check that the state directory is readable "
                              "(IADEEP_HOME) and not on a network filesystem") from None
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path}: database schema v{version} is newer than this iadeep "
                         f"(knows up to v{SCHEMA_VERSION})", hint="upgrade iadeep")
    if not readonly:
        migrate(conn, version, migrate_to)
    return conn


def migrate(conn: sqlite3.Connection, current: int, target: int = SCHEMA_VERSION) -> None:
    """Apply migrations ``current+1 .. target``, each in its own transaction."""
    for version in range(current + 1, target + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(MIGRATIONS[version - 1]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={version}")
            conn.execute("COMMIT")
        except sqlite3.Error:
            conn.execute("ROLLBACK")
            raise


def _statements(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit mid-transaction); a
    trigger's body, whose statements end in ';' too, stays one with its CREATE."""
    out: list[str] = []
    pending = ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                out.append(pending.strip())
            pending = ""
    if pending.strip(" \n;"):
        out.append(pending.strip())
    return out

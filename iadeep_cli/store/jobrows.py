"""Job rows <-> ``Job`` values, and the only code that changes a job's state.

``transition`` checks the state machine, updates the row and appends the event in one
transaction, so the events table is a complete, ordered history of every job.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import sqlite3
import typing
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from .. import checks
from ..errors import NotFoundError
from ..jobs import (
    ACTIVE,
    ATTEMPT_FIELDS,
    Job,
    JobSpec,
    JobState,
    StopReason,
    check_transition,
)
from . import impact

log = logging.getLogger("iadeep.jobs")
# JobSpec fields with a column of their own (the first schema's). Every later field is kept in
# the JSON column ``extra`` under "spec" (see _spec_extra), so a new job option needs no
# migration and no change here.
_SPEC_COLUMNS = ("script", "args", "name", "gpus", "mem_gib", "workload", "priority",
                 "exclusive", "workdir", "env", "retries", "min_speed")
# The columns a Job is decoded from (``job_from_row``): the jobs table also holds what
# accounting writes every poll (``store.impact``), which a job's reader need not fetch and a
# kept decoding need not be invalidated by.  A column added here must be added to the trigger
# that counts their changes (``store.db``, ``job_rows_updated``): tests/unit/test_store.py
# checks that every one of them is counted.
_JOB_COLUMNS = ", ".join(("id", "owner", "state", "submitted_at", "started_at", "ended_at",
                          "node", "gpu_indices", "exit_code", "attempts", "remote_pid",
                          "remote_start", "reason", "observed_speed", "predicted_speed",
                          "extra", "stop_reason", *_SPEC_COLUMNS))
# Columns a transition may set besides the state (guards the f-string SQL below).
_MUTABLE = frozenset({"started_at", "ended_at", "node", "gpu_indices", "exit_code", "attempts",
                      "remote_pid", "remote_start", "priority", "predicted_speed",
                      "observed_speed", "workload", "stop_reason",
                      "exclusive"})   # set by the controller after an out-of-memory while sharing
# Job fields added after the table's columns: kept in its JSON column ``extra`` (no migration),
# read and written like the columns. An empty value (None, False, "", ()) removes its key; 0 is
# a value (an array's task 0).
_IN_EXTRA = ("cancel_requested_by", "orphans", "signalled", "array_id", "array_index",
             "rerun_of", "suspended_at", "suspended_for", "suspended_s", "checkpoint_at",
             "checkpoints", "yielded", "idle_since", "idle_requeued", "idle_marked", "preempt_for",
             "preempt_at", "preempted")


def job_from_row(row: sqlite3.Row) -> Job:
    extra = json.loads(row["extra"])
    spec = JobSpec(
        script=row["script"], args=tuple(json.loads(row["args"])), name=row["name"],
        gpus=row["gpus"], mem_gib=row["mem_gib"], workload=row["workload"],
        priority=row["priority"], exclusive=bool(row["exclusive"]), workdir=row["workdir"],
        env=tuple(tuple(kv) for kv in json.loads(row["env"])), retries=row["retries"],
        min_speed=row["min_speed"], **_spec_from_extra(extra.get("spec") or {}),
    )
    return Job(
        id=row["id"], owner=row["owner"], spec=spec, state=JobState(row["state"]),
        submitted_at=row["submitted_at"], started_at=row["started_at"],
        ended_at=row["ended_at"], node=row["node"],
        gpu_indices=tuple(json.loads(row["gpu_indices"])), exit_code=row["exit_code"],
        attempts=row["attempts"], remote_pid=row["remote_pid"],
        remote_start=row["remote_start"], reason=row["reason"],
        observed_speed=row["observed_speed"], predicted_speed=row["predicted_speed"],
        stop_reason=StopReason(row["stop_reason"]) if row["stop_reason"] else None,
        **_extra_fields(extra),
    )


class Decoded:
    """Jobs decoded from their rows, each kept while its row is unchanged (``Job`` is frozen,
    so one value can be handed out many times), and the answers of whole selects, each kept
    while the database is unchanged.  The controller reads the same active jobs many times a
    round; decoding a row (four JSON columns) is most of a read's cost, so a row whose every
    column is as before gives back the job decoded last time; and a question asked again before
    any job changed (``version``: no write to a job's columns by any connection) is answered
    without reading a row (``answer``, ``keep``: only for answers read in a transaction that
    wrote nothing, so none can be rolled back), in this round or a later one.  ``sweep`` (once
    a round) forgets the jobs not read and the questions not asked since the last sweep, so
    what is kept follows what the round reads, not the history."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[tuple[Any, ...], Job]] = {}
        self._seen: set[int] = set()
        self._answers: dict[Hashable, tuple[int, list[Job]]] = {}
        self._asked: set[Hashable] = set()

    def answer(self, query: Hashable, version: int) -> list[Job] | None:
        """The jobs ``query`` found when the database was last at ``version``, else None."""
        kept = self._answers.get(query)
        if kept is None or kept[0] != version:
            return None
        self._asked.add(query)
        self._seen.update(job.id for job in kept[1])
        return list(kept[1])

    def keep(self, query: Hashable, version: int, jobs: list[Job]) -> None:
        self._asked.add(query)
        self._answers[query] = (version, list(jobs))

    def job(self, row: sqlite3.Row) -> Job:
        key = tuple(row)
        job_id = row["id"]
        self._seen.add(job_id)
        kept = self._kept.get(job_id)
        if kept is not None and kept[0] == key:
            return kept[1]
        job = job_from_row(row)
        self._kept[job_id] = (key, job)
        return job

    def sweep(self) -> None:
        self._kept = {i: v for i, v in self._kept.items() if i in self._seen}
        self._seen = set()
        self._answers = {q: v for q, v in self._answers.items() if q in self._asked}
        self._asked = set()


def version(conn: sqlite3.Connection) -> int:
    """What changes whenever a job as decoded may have: the count of writes that changed the
    value of a column a ``Job`` is read from (``_JOB_COLUMNS``), inserts and deletes, kept by
    the database's own triggers (schema v13) for every connection's writes, committed or in
    this transaction.
    What accounting rewrites every poll, the nodes' snapshots and every other table leave it
    as it was: a round's questions stay answered across them."""
    return int(conn.execute("SELECT n FROM job_rows_changed").fetchone()[0])


def _extra_fields(extra: dict[str, Any]) -> dict[str, Any]:
    return {"cancel_requested_by": extra.get("cancel_requested_by"),
            "orphans": tuple(extra.get("orphans", ())),
            "signalled": bool(extra.get("signalled", False)),
            "array_id": extra.get("array_id"), "array_index": extra.get("array_index"),
            "rerun_of": extra.get("rerun_of"), "suspended_at": extra.get("suspended_at"),
            "suspended_for": extra.get("suspended_for"),
            "suspended_s": float(extra.get("suspended_s", 0.0)),
            "checkpoint_at": extra.get("checkpoint_at"),
            "checkpoints": int(extra.get("checkpoints", 0)),
            "yielded": (str(extra["yielded"][0]), int(extra["yielded"][1]))
            if extra.get("yielded") else None,
            "idle_since": extra.get("idle_since"),
            "idle_requeued": bool(extra.get("idle_requeued", False)),
            "idle_marked": bool(extra.get("idle_marked", False)),
            "preempt_for": extra.get("preempt_for"), "preempt_at": extra.get("preempt_at"),
            "preempted": str(extra.get("preempted", ""))}


@functools.cache
def _later_spec_fields() -> dict[str, Any]:
    """JobSpec's fields without a column, and their annotations."""
    hints = typing.get_type_hints(JobSpec)
    return {f.name: hints[f.name] for f in dataclasses.fields(JobSpec)
            if f.name not in _SPEC_COLUMNS}


def _spec_extra(spec: JobSpec) -> dict[str, Any]:
    """The spec's fields without a column that differ from their default, as JSON values."""
    defaults = JobSpec(script="")
    return {name: getattr(spec, name) for name in _later_spec_fields()
            if getattr(spec, name) != getattr(defaults, name)}


def _spec_from_extra(stored: dict[str, Any]) -> dict[str, Any]:
    """Those fields back, typed by their annotations (JSON made tuples lists); a field this
    version does not know (written by a newer one) is left out."""
    known = _later_spec_fields()
    return {k: checks.typed(f"spec.{k}", v, known[k]) for k, v in stored.items() if k in known}


def _spec_values(spec: JobSpec) -> list[Any]:
    return [spec.script, json.dumps(list(spec.args)), spec.name, spec.gpus, spec.mem_gib,
            spec.workload, spec.priority, int(spec.exclusive), spec.workdir,
            json.dumps([list(kv) for kv in spec.env]), spec.retries, spec.min_speed]


def insert(conn: sqlite3.Connection, owner: str, spec: JobSpec, now: float,
           token: str | None = None, reason: str = "submitted", actor: str | None = None
           ) -> tuple[int, bool]:
    """Insert a queued job (held with --hold); returns (id, created). A repeated ``token``
    returns the first id, so a client that retries after a lost reply never creates a
    duplicate. ``reason`` and ``actor`` (default: the owner) are its first event's."""
    if token is not None:
        row = conn.execute("SELECT id FROM jobs WHERE client_token=?", (token,)).fetchone()
        if row:
            return row["id"], False
    state = JobState.HELD if spec.hold else JobState.QUEUED   # --hold: queued held
    cols = ", ".join(_SPEC_COLUMNS)
    marks = ", ".join("?" * len(_SPEC_COLUMNS))
    later = _spec_extra(spec)
    cur = conn.execute(
        f"INSERT INTO jobs (client_token, owner, state, submitted_at, extra, {cols}) "
        f"VALUES (?, ?, ?, ?, ?, {marks})",
        [token, owner, state.value, now, json.dumps({"spec": later} if later else {}),
         *_spec_values(spec)],
    )
    job_id = cur.lastrowid
    assert job_id is not None   # set by every INSERT
    add_event(conn, job_id, now, None, state,
              reason + (" held (--hold)" if spec.hold else ""), actor or owner)
    return job_id, True


def replace_spec(conn: sqlite3.Connection, job_id: int, spec: JobSpec) -> None:
    """Write a changed spec (`iadeep queue update`): its columns and its fields in ``extra``."""
    row = conn.execute("SELECT extra FROM jobs WHERE id=?", (job_id,)).fetchone()
    extra = json.loads(row["extra"]) if row else {}
    later = _spec_extra(spec)
    if later:
        extra["spec"] = later
    else:
        extra.pop("spec", None)
    sets = ", ".join(f"{c}=?" for c in _SPEC_COLUMNS)
    conn.execute(f"UPDATE jobs SET {sets}, extra=? WHERE id=?",
                 [*_spec_values(spec), json.dumps(extra), job_id])


# An event's kind (``events.kind``) where its states alone do not say what it was: the job's
# GPUs sat idle past lab.idle_after (controller/round/steps/idle.py; told to its owner).
IDLE = "idle"


def add_event(conn: sqlite3.Connection, job_id: int, at: float, old: JobState | None,
              new: JobState, reason: str, actor: str, kind: str | None = None) -> None:
    row = (job_id, at, old.value if old else None, new.value, reason, actor)
    if kind is None:   # (the column's default; and what a schema before v14 can take)
        conn.execute("INSERT INTO events (job_id, at, old_state, new_state, reason, actor) "
                     "VALUES (?, ?, ?, ?, ?, ?)", row)
    else:
        conn.execute("INSERT INTO events (job_id, at, old_state, new_state, reason, actor, "
                     "kind) VALUES (?, ?, ?, ?, ?, ?, ?)", (*row, kind))


def get(conn: sqlite3.Connection, job_id: int) -> Job:
    row = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no job with id {job_id}",
                            hint="`iadeep queue list --all` shows every job id")
    return job_from_row(row)


def select(conn: sqlite3.Connection, states: Iterable[JobState] | None = None,
           owner: str | None = None, limit: int | None = None,
           node: str | None = None, last: int | None = None,
           before: int | None = None, decoded: Decoded | None = None) -> list[Job]:
    """Jobs filtered by state, owner and node (and ids below ``before``), oldest first (the
    queue's natural order); ``limit`` keeps the oldest, ``last`` the newest of them.
    ``decoded``: rows unchanged since it last decoded them are not decoded again."""
    where: list[str] = []
    params: list[object] = []
    if before is not None:
        where.append("id < ?")
        params.append(int(before))
    if states is not None:
        states = list(states)
        where.append(f"state IN ({', '.join('?' * len(states))})")
        params += [s.value for s in states]
    for column, value in (("owner", owner), ("node", node)):
        if value is not None:
            where.append(f"{column}=?")
            params.append(value)
    sql = f"SELECT {_JOB_COLUMNS} FROM jobs" + (f" WHERE {' AND '.join(where)}" if where else "")
    sql += " ORDER BY id DESC" if last is not None else " ORDER BY id"
    count = last if last is not None else limit
    if count is not None:
        sql += f" LIMIT {int(count)}"
    decode = decoded.job if decoded is not None else job_from_row
    found = [decode(r) for r in conn.execute(sql, params)]
    return found[::-1] if last is not None else found


def states(conn: sqlite3.Connection, ids: Iterable[int]) -> dict[int, JobState]:
    """The state of each of these jobs that exists (a dependency check reads only these)."""
    rows = conn.execute("SELECT id, state FROM jobs WHERE id IN (SELECT value FROM json_each(?))",
                        (json.dumps(sorted(set(ids))),))
    return {r["id"]: JobState(r["state"]) for r in rows}


# The expression the jobs_array index is on (store/db.py, v8): a query must spell it the same
# way for SQLite to use the index.
ARRAY_ID = "json_extract(extra, '$.array_id')"


def array_tasks(conn: sqlite3.Connection, array_id: int) -> list[Job]:
    """The tasks of array ``array_id`` in index order; [] if it names no array."""
    rows = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {ARRAY_ID} = ? ORDER BY id",
                        (array_id,))
    return [job_from_row(r) for r in rows]


def with_orphans(conn: sqlite3.Connection) -> list[Job]:
    """Jobs (any state) with an abandoned attempt that may still run on some node."""
    rows = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs "
                        "WHERE json_extract(extra, '$.orphans') IS NOT NULL "
                        "ORDER BY id")
    return [job_from_row(r) for r in rows]


def transition(conn: sqlite3.Connection, job_id: int, new: JobState, reason: str, actor: str,
               now: float, **fields: Any) -> Job:
    """Move a job to ``new`` (checked against the state machine) and record the event."""
    job = get(conn, job_id)
    check_transition(job_id, job.state, new)
    running = JobState.RUNNING in (job.state, new)
    if running:   # the jobs on its GPUs accrue up to now at their old rates (store/impact.py)
        impact.accrue(conn, now, only=[(job.node or "", g) for g in job.gpu_indices])
    update(conn, job_id, state=new.value, reason=reason, **fields)
    _hold_time(conn, job_id, job.state, new, now)
    add_event(conn, job_id, now, job.state, new, reason, actor)
    if running:
        if new is not JobState.RUNNING:
            conn.execute("UPDATE jobs SET acct_at = NULL, acct_rate = NULL WHERE id=?",
                         (job_id,))
        # the GPUs it left and the ones it is on now (what ``update`` just wrote, or kept)
        node, indices = fields.get("node", job.node), fields.get("gpu_indices", job.gpu_indices)
        gpus = {(job.node or "", g) for g in job.gpu_indices}
        gpus |= {(node or "", g) for g in indices or ()}
        impact.reprice(conn, now, only=gpus)   # their sharing changed; this job starts at now
    log.info("job %d (%s/%s): %s -> %s: %s", job_id, job.owner, job.name, job.state, new, reason)
    return get(conn, job_id)


def no_attempt() -> dict[str, Any]:
    """The fields that clear a job's attempt (``jobs.Attempt``): it is placed nowhere and
    nothing of it runs. For ``update``/``transition``: None empties a column and removes a
    key of ``extra`` (read back as the field's default); the GPU list is a column of its own."""
    return {**dict.fromkeys(ATTEMPT_FIELDS), "gpu_indices": ()}


def requeue(conn: sqlite3.Connection, job_id: int, reason: str, actor: str, now: float, *,
            started: bool, **fields: Any) -> Job:
    """Put a job back in the queue: the one way a job goes back there from a node.

    Its attempt is dropped whole (``no_attempt``). ``started``: whether the attempt may have
    run. If it may have, its node is remembered (``orphans``: the controller stops whatever of
    it still runs there and sets its directory aside before a new attempt may start there)
    and the attempt stays counted; if it provably never ran, it does not count (``attempts``
    one less). ``fields``: anything else to set in the same transition (a checkpoint's
    counters). Checked against the state machine like any ``transition``."""
    job = get(conn, job_id)
    if started:
        fields.setdefault("orphans", job.orphans_with(job.node))
    else:
        fields.setdefault("attempts", max(0, job.attempts - 1))
    return transition(conn, job_id, JobState.QUEUED, reason, actor, now,
                      **{**no_attempt(), **fields})


def _hold_time(conn: sqlite3.Connection, job_id: int, old: JobState, new: JobState,
               now: float) -> None:
    """Keep the job's time holding GPUs (``starting``/``running``, over all attempts) and its
    first start on its row, so the report sums columns instead of reading every event."""
    if old not in ACTIVE and new in ACTIVE:
        conn.execute("UPDATE jobs SET held_since=?, first_started_at=COALESCE("
                     "first_started_at, ?) WHERE id=?", (now, now, job_id))
    elif old in ACTIVE and new not in ACTIVE:
        conn.execute("UPDATE jobs SET held_s = held_s + MAX(0, ? - COALESCE(held_since, ?)), "
                     "held_since = NULL WHERE id=?", (now, now, job_id))


def update(conn: sqlite3.Connection, job_id: int, **fields: Any) -> None:
    """Set columns without a state change (priority, speeds, the wait reason...)."""
    unknown = set(fields) - _MUTABLE - set(_IN_EXTRA) - {"state", "reason"}
    if unknown:
        raise ValueError(f"not an updatable job column: {sorted(unknown)}")
    in_extra = {k: fields.pop(k) for k in _IN_EXTRA if k in fields}
    if in_extra:
        row = conn.execute("SELECT extra FROM jobs WHERE id=?", (job_id,)).fetchone()
        extra = json.loads(row["extra"]) if row else {}
        for k, v in in_extra.items():
            if not (v is None or v is False or v == "" or v == ()):
                extra[k] = list(v) if isinstance(v, tuple) else v
            else:
                extra.pop(k, None)
        fields["extra"] = extra
    encoded = {k: (json.dumps(list(v)) if k == "gpu_indices" else
                   json.dumps(v) if k == "extra" else
                   v.value if isinstance(v, StopReason) else v) for k, v in fields.items()}
    sets = ", ".join(f"{k}=?" for k in encoded)
    conn.execute(f"UPDATE jobs SET {sets} WHERE id=?", [*encoded.values(), job_id])


def events(conn: sqlite3.Connection, job_id: int) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT at, old_state, new_state, reason, actor FROM events "
                        "WHERE job_id=? ORDER BY id", (job_id,))
    return [dict(r) for r in rows]


def set_reasons(conn: sqlite3.Connection, reasons: Sequence[tuple[int, str]]) -> None:
    """Record why each queued job waits (only rows whose reason changed are written)."""
    conn.executemany("UPDATE jobs SET reason=? WHERE id=? AND reason<>?",
                     [(r, i, r) for i, r in reasons])


def ended_between(conn: sqlite3.Connection, node: str, after: float, until: float) -> list[int]:
    """Ids of jobs that ended on ``node`` in (after, until]: whose directories may go."""
    rows = conn.execute("SELECT id FROM jobs WHERE node=? AND ended_at>? AND ended_at<=? "
                        "ORDER BY id", (node, after, until))
    return [r["id"] for r in rows]


def attained(conn: sqlite3.Connection, ids: Iterable[int], now: float) -> dict[int, float]:
    """GPU-seconds each job has held GPUs for over all its attempts up to ``now`` (its
    ``held_s`` and, while it holds them, the time since ``held_since``, times its GPUs):
    the attained service the lab's ``preemption: las`` ranks by."""
    wanted = list(dict.fromkeys(ids))
    out: dict[int, float] = {}
    for at in range(0, len(wanted), 500):   # SQLite's bound on parameters
        part = wanted[at:at + 500]
        rows = conn.execute(
            "SELECT id, gpus, held_s + MAX(0, ? - COALESCE(held_since, ?)) AS s FROM jobs "
            f"WHERE id IN ({', '.join('?' * len(part))})", (now, now, *part))
        out.update((r["id"], float(r["s"] or 0.0) * r["gpus"]) for r in rows)
    return out


def run_times(conn: sqlite3.Connection, since: float, limit: int = 5000
              ) -> list[tuple[str | None, float, str, float | None]]:
    """(workload label, seconds from its start to its end, owner, its --time or None) of the
    jobs that ran to an end (succeeded, failed, stopped at --time) after ``since``, newest
    first, at most ``limit``: the lab's run times, which placement's ``sharing: jct`` and the
    run-time estimates (``scheduler.remaining.estimate_runtime``, per user and label, and run
    time over --time) learn from."""
    rows = conn.execute(
        "SELECT workload, ended_at - started_at AS d, owner, "
        "json_extract(extra, '$.spec.time_limit_s') AS lim FROM jobs WHERE ended_at > ? "
        "AND started_at IS NOT NULL AND ended_at >= started_at "
        "AND state IN ('succeeded', 'failed', 'timeout') ORDER BY ended_at DESC LIMIT ?",
        (since, limit))
    return [(r["workload"], float(r["d"]), r["owner"],
             float(r["lim"]) if isinstance(r["lim"], (int, float)) else None) for r in rows]

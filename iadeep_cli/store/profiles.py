"""Interference data measured in this lab: workload profiles and co-location speeds.

These take precedence over the shipped H200 data for their GPU model when the model is fitted.
Profiles learnt from jobs change only through ``learn`` (by the rules in ``iadeep_cli.profiles``):
every sample is kept with its job, owner and time, accepted or not, so ``iadeep profile show``
can say where a profile came from. The one exception is ``refresh``: a *phase* sample (a running
job whose behaviour alone changed for good, ``scheduler/detectors.PhaseDetector``) replaces the
profile, since the outlier rule would reject exactly the change it reports; learning then
starts again from it (earlier samples describe the old phase).

A phase sample is one job's word, and every member's placement depends on the lab's profile, so
one user's jobs cannot replace it: the sample is *held* as its owner's (kind 'held', shown by
``iadeep profile show``; ``held`` reads them) until a held sample of another user agrees with it
(``agrees``), or an admin adopts it (``adopt``, `iadeep profile pin LABEL --adopt USER`). Only
then does it become the lab's profile (kind 'phase', accepted).
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from ..errors import NotFoundError
from ..profiles import (
    PAIR_TOLERANCE,
    WINDOW,
    CoLocation,
    Profile,
    agrees,
    merged,
    outlier_reason,
    pair_agrees,
)

SHOWN_SAMPLES = 20   # per profile, newest first, in `iadeep profile show`


def upsert_profile(conn: sqlite3.Connection, profile: Profile, now: float,
                   source: str = "measured") -> None:
    """Write a profile's values (a pin on it stays)."""
    conn.execute(
        "INSERT INTO profiles (gpu_model, workload, data, source, updated_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT(gpu_model, workload) DO UPDATE SET "
        "data=excluded.data, source=excluded.source, updated_at=excluded.updated_at",
        (profile.gpu_model, profile.workload, json.dumps(asdict(profile)), source, now))


def load_profiles(conn: sqlite3.Connection) -> list[tuple[Profile, str, float]]:
    """(profile, source, updated_at) for every stored profile."""
    rows = conn.execute("SELECT data, source, updated_at FROM profiles ORDER BY workload")
    return [(Profile(**json.loads(r["data"])), r["source"], r["updated_at"]) for r in rows]


def learn(conn: sqlite3.Connection, sample: Profile, *, job_id: int, owner: str, now: float,
          shipped: Profile | None = None) -> tuple[Profile | None, str]:
    """Merge one job's sample into its profile, or reject it (pinned profile, outlier).

    Returns (the profile now in effect if it changed, else None; what happened, for the log).
    Each sample is kept with a note: why it was rejected, or where a seed came from.
    The first sample of a profile is compared with what was in effect before it: the lab's
    earlier profile, else the shipped one measured on the same GPU model (``shipped``).
    """
    key = (sample.gpu_model, sample.workload)
    row = conn.execute("SELECT data, source, pinned_by FROM profiles "
                       "WHERE gpu_model=? AND workload=?", key).fetchone()
    if row is not None and row["pinned_by"]:
        note = f"pinned by {row['pinned_by']}"
        _add_sample(conn, sample, job_id, owner, now, False, note)
        return None, f"rejected: {note}"
    history = [Profile(**json.loads(r["data"])) for r in reversed(conn.execute(
        "SELECT data FROM profile_samples WHERE gpu_model=? AND workload=? AND accepted=1 "
        "AND id >= COALESCE((SELECT MAX(id) FROM profile_samples WHERE gpu_model=? AND "
        "workload=? AND kind='phase' AND accepted=1), 0) ORDER BY id DESC LIMIT ?",
        (*key, *key, WINDOW)).fetchall())]
    if not history:
        seed, origin = _in_effect(row, shipped, sample.gpu_model)
        if seed is not None:
            _add_sample(conn, seed, None, None, now, True, f"in effect before learning: {origin}")
            history = [seed]
    reason = outlier_reason(sample, history)
    if reason is not None:
        note = f"outlier: {reason}"
        _add_sample(conn, sample, job_id, owner, now, False, note)
        return None, f"rejected: {note}"
    _add_sample(conn, sample, job_id, owner, now, True, "")
    window = [*history, sample][-WINDOW:]
    profile = merged(window)
    source = (f"job {job_id} ({owner})" if len(window) == 1 else
              f"median of {len(window)} samples, last job {job_id} ({owner})")
    upsert_profile(conn, profile, now, source)
    return profile, f"merged: {source}"


def refresh(conn: sqlite3.Connection, sample: Profile, *, job_id: int, owner: str, now: float,
            note: str, rate_tolerance: float = 0.25) -> tuple[Profile | None, str]:
    """A running job's *phase* sample: it replaces the workload's profile once jobs of two
    users agree on it (never judged against the old samples: it reports that they no longer
    hold). Alone, it is held as ``owner``'s (kind 'held'); a held sample of another user that
    ``agrees`` with it (within ``rate_tolerance`` on the solo rate) corroborates it, and the
    profile becomes the two's merge (kind 'phase', both accepted). A pinned profile stays (the
    admin's pin wins; the sample is kept, rejected). Returns (the profile now in effect if it
    changed, else None; what happened)."""
    row = conn.execute("SELECT pinned_by FROM profiles WHERE gpu_model=? AND workload=?",
                       (sample.gpu_model, sample.workload)).fetchone()
    if row is not None and row["pinned_by"]:
        why = f"pinned by {row['pinned_by']}"
        _add_sample(conn, sample, job_id, owner, now, False, f"{note}; {why}", kind="phase")
        return None, f"not refreshed: {why}"
    others = [h for h in _held_rows(conn, sample.gpu_model, sample.workload)
              if h["owner"] != owner
              and agrees(sample, Profile(**json.loads(h["data"])), rate_tolerance)]
    if not others:
        held = (f"held as {owner}'s until a job of another user agrees, or an admin adopts it "
                f"(iadeep profile pin {sample.workload} --adopt {owner})")
        _add_sample(conn, sample, job_id, owner, now, False, f"{held}; {note}", kind="held")
        return None, held
    partner = others[-1]
    conn.execute("UPDATE profile_samples SET kind='phase', accepted=1 WHERE id=?",
                 (partner["id"],))
    _add_sample(conn, sample, job_id, owner, now, True, note, kind="phase")
    profile = merged([Profile(**json.loads(partner["data"])), sample])
    source = (f"phase change of jobs {partner['job_id']} ({partner['owner']}) and {job_id} "
              f"({owner})")
    upsert_profile(conn, profile, now, source)
    return profile, f"refreshed: {source}"


def held(conn: sqlite3.Connection) -> dict[tuple[str, str], Profile]:
    """(owner, workload) -> the newest phase profile held as that user's (not yet the lab's),
    per GPU model the newest one; what that user's later jobs are judged against."""
    out: dict[tuple[str, str], Profile] = {}
    for r in conn.execute("SELECT DISTINCT gpu_model, workload FROM profile_samples "
                          "WHERE kind='held'").fetchall():
        for h in _held_rows(conn, r["gpu_model"], r["workload"]):
            out[(h["owner"], r["workload"])] = Profile(**json.loads(h["data"]))
    return out


def adopt(conn: sqlite3.Connection, workload: str, owner: str, by: str, now: float) -> None:
    """An admin makes ``owner``'s held phase profile(s) of ``workload`` the lab's (every GPU
    model it has one for); the caller pins them."""
    models = [r["gpu_model"] for r in conn.execute(
        "SELECT DISTINCT gpu_model FROM profile_samples WHERE workload=? AND kind='held'",
        (workload,)).fetchall()]
    rows = [h for model in models for h in _held_rows(conn, model, workload)
            if h["owner"] == owner]
    if not rows:
        raise NotFoundError(f"no phase profile of {workload!r} is held as {owner!r}'s",
                            hint=f"`iadeep profile show {workload}` lists the samples held "
                                 "(HELD) and their users")
    for h in rows:
        conn.execute("UPDATE profile_samples SET kind='phase', accepted=1 WHERE id=?",
                     (h["id"],))
        upsert_profile(conn, Profile(**json.loads(h["data"])), now,
                       f"phase change of job {h['job_id']} ({owner}), adopted by {by}")


def _held_rows(conn: sqlite3.Connection, gpu_model: str, workload: str) -> list[sqlite3.Row]:
    """Each user's newest held sample of a profile since its last accepted phase sample (one
    before describes an older phase), oldest first."""
    return conn.execute(
        "SELECT * FROM profile_samples WHERE id IN (SELECT MAX(id) FROM profile_samples "
        "WHERE gpu_model=? AND workload=? AND kind='held' AND id > COALESCE((SELECT MAX(id) "
        "FROM profile_samples WHERE gpu_model=? AND workload=? AND kind='phase' AND "
        "accepted=1), 0) GROUP BY owner) ORDER BY id",
        (gpu_model, workload, gpu_model, workload)).fetchall()


def _in_effect(row: sqlite3.Row | None, shipped: Profile | None, gpu_model: str
               ) -> tuple[Profile | None, str]:
    """The profile a first sample is judged against. A shipped solo rate is another program's
    (other batch size): it must not become this lab's, so it is dropped."""
    if row is not None:
        return Profile(**json.loads(row["data"])), row["source"]
    if shipped is not None and shipped.gpu_model == gpu_model:
        return replace(shipped, solo_it_per_s=None), "shipped profile"
    return None, ""


def _add_sample(conn: sqlite3.Connection, sample: Profile, job_id: int | None,
                owner: str | None, now: float, accepted: bool, note: str,
                kind: str = "job") -> None:
    conn.execute("INSERT INTO profile_samples (gpu_model, workload, data, job_id, owner, at, "
                 "accepted, note, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (sample.gpu_model, sample.workload, json.dumps(asdict(sample)), job_id, owner,
                  now, int(accepted), note, kind))


def set_pinned(conn: sqlite3.Connection, workload: str, by: str | None, now: float,
               shipped: Profile | None = None) -> None:
    """Pin (``by``: the admin) or unpin (``by`` None) every GPU model's profile of
    ``workload``. Pinning a label the lab never learnt pins a copy of its ``shipped`` profile
    (without its solo rate, see ``_in_effect``)."""
    if conn.execute("SELECT 1 FROM profiles WHERE workload=?", (workload,)).fetchone() is None:
        if shipped is None:
            raise NotFoundError(f"no profile named {workload!r}",
                                hint="`iadeep profile list` shows every label")
        if by:
            upsert_profile(conn, replace(shipped, solo_it_per_s=None), now, "shipped profile")
    conn.execute("UPDATE profiles SET pinned_by=?, pinned_at=? WHERE workload=?",
                 (by, now if by else None, workload))


def details(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    """Per workload label: pin and the newest samples (any GPU model), for the views."""
    out: dict[str, dict[str, Any]] = {}
    for r in conn.execute("SELECT workload, pinned_by, pinned_at FROM profiles "
                          "WHERE pinned_by IS NOT NULL"):
        out.setdefault(r["workload"], {"samples": []}).update(pinned_by=r["pinned_by"],
                                                               pinned_at=r["pinned_at"])
    rows = conn.execute(
        "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY workload ORDER BY id DESC) "
        "AS n FROM profile_samples) WHERE n <= ? ORDER BY id DESC", (SHOWN_SAMPLES,))
    for r in rows:
        data = json.loads(r["data"])
        out.setdefault(r["workload"], {"samples": []})["samples"].append({
            "at": r["at"], "job": r["job_id"], "user": r["owner"], "gpu_model": r["gpu_model"],
            "accepted": bool(r["accepted"]), "note": r["note"],
            **{k: data[k] for k in ("gpu_util", "mem_util", "peak_mem_gib")}})
    return out


# --------------------------------------------------------------------------------------------
# Co-location rows, held as the reporting member's until another member's jobs agree, as phase
# samples are: what one member's jobs say about sharing (their progress rates beside another
# job, an out-of-memory line) would otherwise change every member's placement (the model's
# refit) and the lab's settings (self-tuning's replay). A row's ``owners`` are the users whose
# jobs' word it is; it is 'held' until a row of users it shares none with agrees
# (``profiles.pair_agrees``), or an admin adopts it (`iadeep profile pair-adopt ID`). Only
# 'lab' rows are read by ``load_colocations`` (every fit and replay).
# --------------------------------------------------------------------------------------------
def add_colocation(conn: sqlite3.Connection, obs: CoLocation, now: float,
                   owners: Sequence[str] | None = None, note: str = "",
                   tolerance: float = PAIR_TOLERANCE) -> tuple[int, str]:
    """Record a measurement; (its row id, its kind: 'lab' or 'held').

    ``owners``: the users whose jobs reported it; None records the lab's own (data an admin
    loads). A reported row is held as its owners' unless a row of other users (none in
    common) agrees with it; then both are the lab's."""
    who = sorted(set(owners)) if owners is not None else []
    kind, partner = "lab", None
    if owners is not None:
        partner = _agreeing(conn, obs, set(who), tolerance)
        kind = "lab" if partner is not None else "held"
        if partner is None:
            note = (f"{note}; " if note else "") + (
                f"held as {', '.join(who)}'s until another member's jobs agree, or an admin "
                "adopts it")
        else:
            note = (f"{note}; " if note else "") + (
                f"agrees with row {partner['id']} ({partner['owners']})")
            if partner["kind"] == "held":
                conn.execute("UPDATE colocations SET kind='lab', note=? WHERE id=?",
                             (_agreed_note(partner["note"], f"agreed by jobs of {', '.join(who)}"),
                              partner["id"]))
    cur = conn.execute(
        "INSERT INTO colocations (gpu_model, jobs, speeds, samples, observed_at, owners, kind, "
        "note) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (obs.gpu_model, json.dumps(list(obs.jobs)), json.dumps(list(obs.speeds)), obs.samples,
         now, ",".join(who), kind, note))
    return int(cur.lastrowid or 0), kind


def _agreeing(conn: sqlite3.Connection, obs: CoLocation, who: set[str], tolerance: float
              ) -> sqlite3.Row | None:
    """The newest reported row of the same pair whose users are none of ``who`` and that
    agrees with ``obs``, if any."""
    orders = (json.dumps(list(obs.jobs)), json.dumps(list(obs.jobs[::-1])))
    for r in conn.execute("SELECT * FROM colocations WHERE gpu_model=? AND jobs IN (?, ?) "
                          "AND owners != '' ORDER BY id DESC", (obs.gpu_model, *orders)):
        if who & set(r["owners"].split(",")):
            continue
        if pair_agrees(obs, _colocation(r), tolerance):
            found: sqlite3.Row = r
            return found
    return None


def _agreed_note(note: str, by: str) -> str:
    """A held row's note once it is the lab's: 'held as ...' becomes ``by``."""
    head = note.split("held as ")[0].rstrip("; ")
    return f"{head}; {by}" if head else by


def _colocation(r: sqlite3.Row) -> CoLocation:
    return CoLocation(r["gpu_model"], tuple(json.loads(r["jobs"])),
                      tuple(json.loads(r["speeds"])), r["samples"])


def load_colocations(conn: sqlite3.Connection) -> list[CoLocation]:
    """The lab's co-location rows (agreed, adopted, or the lab's own): what fits and replays
    use. Rows held as one member's are not among them."""
    rows = conn.execute("SELECT gpu_model, jobs, speeds, samples FROM colocations "
                        "WHERE kind='lab' ORDER BY id")
    return [_colocation(r) for r in rows]


def colocation_rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every co-location row, held or the lab's, oldest first (`iadeep profile pairs`)."""
    return [{"id": r["id"], "gpu_model": r["gpu_model"], "workloads": json.loads(r["jobs"]),
             "speeds": json.loads(r["speeds"]), "samples": r["samples"],
             "owners": [o for o in r["owners"].split(",") if o], "kind": r["kind"],
             "note": r["note"], "observed_at": r["observed_at"]}
            for r in conn.execute("SELECT * FROM colocations ORDER BY id")]


def adopt_colocations(conn: sqlite3.Connection, ids: Sequence[int], by: str) -> None:
    """An admin makes held rows the lab's (rows already the lab's stay as they are)."""
    for row_id in _existing(conn, ids):
        row = conn.execute("SELECT note FROM colocations WHERE id=? AND kind='held'",
                           (row_id,)).fetchone()
        if row is not None:
            conn.execute("UPDATE colocations SET kind='lab', note=? WHERE id=?",
                         (_agreed_note(row["note"], f"adopted by {by}"), row_id))


def remove_colocations(conn: sqlite3.Connection, ids: Sequence[int]) -> None:
    """An admin removes rows (held or the lab's); the model's next refit goes without them."""
    for row_id in _existing(conn, ids):
        conn.execute("DELETE FROM colocations WHERE id=?", (row_id,))


def _existing(conn: sqlite3.Connection, ids: Sequence[int]) -> list[int]:
    """``ids``, each checked to be a row: else a NotFoundError naming the first that is not."""
    for row_id in ids:
        if conn.execute("SELECT 1 FROM colocations WHERE id=?", (row_id,)).fetchone() is None:
            raise NotFoundError(f"no co-location row {row_id}",
                                hint="`iadeep profile pairs` lists the rows and their ids")
    return list(dict.fromkeys(ids))

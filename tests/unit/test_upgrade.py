"""Upgrading keeps the database: a database made by the first release (and one at the first
migration's schema) is migrated by today's code, which finds every job with every field and
every event as the first release read them back.

The fixtures in tests/fixtures/first_schema/ were written by the first release's own code
(``make.py`` there unpacks it from git and records the jobs with it); the expected values in
``jobs.json`` are that release's reading of its own rows, not today's.
"""
import json
import sqlite3
from pathlib import Path

import pytest

from iadeep_cli.jobs import ACTIVE, JobState
from iadeep_cli.store import Store, db, jobrows as jobs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "first_schema"
EXPECTED = json.loads((FIXTURES / "jobs.json").read_text())
# Columns the first migration (v1) did not have yet: a v1 database's jobs have their defaults.
V3_FIELDS = {"min_speed": None, "predicted_speed": None, "observed_speed": None}


def _old_database(tmp_path: Path, fixture: str) -> Path:
    path = tmp_path / "iadeep.db"
    conn = sqlite3.connect(path)
    conn.executescript((FIXTURES / fixture).read_text())
    conn.close()
    return path


def _expected(fixture: str) -> list[dict]:
    out = []
    for entry in EXPECTED:
        job = json.loads(json.dumps(entry["job"]))
        if fixture == "v1.sql":
            job["spec"]["min_speed"] = None
            job.update({k: v for k, v in V3_FIELDS.items() if k != "min_speed"})
            job["extra"] = {}
        out.append({"job": job, "events": entry["events"]})
    return out


def _held(events: list[dict]) -> tuple[float, float | None]:
    """Seconds on GPUs in finished stretches, and when the current stretch began."""
    held, since = 0.0, None
    for e in events:
        on = e["new_state"] in ("starting", "running")
        if on and since is None:
            since = e["at"]
        elif not on and since is not None:
            held, since = held + e["at"] - since, None
    return held, since


@pytest.mark.parametrize("fixture", ["v3_first_release.sql", "v1.sql"])
def test_first_schema_upgrades_and_keeps_every_job(tmp_path, fixture):
    path = _old_database(tmp_path, fixture)
    with sqlite3.connect(path) as conn:
        old_version = conn.execute("PRAGMA user_version").fetchone()[0]
    assert old_version == (3 if fixture.startswith("v3") else 1) < db.SCHEMA_VERSION

    store = Store(path)
    expected = _expected(fixture)
    with store.tx() as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
        found = jobs.select(c)
        assert [j.id for j in found] == [e["job"]["id"] for e in expected]
        for want, job in zip(expected, found):
            w = want["job"]
            # every field the first release had, as it read it back
            for name, value in w["spec"].items():
                got = getattr(job.spec, name)
                got = [list(v) for v in got] if name == "env" else got
                assert (list(got) if isinstance(got, tuple) else got) == value, (job.id, name)
            for name, value in w.items():
                if name in ("spec", "extra"):
                    continue
                got = getattr(job, name)
                got = got.value if isinstance(got, JobState) else got
                assert (list(got) if isinstance(got, tuple) else got) == value, (job.id, name)
            assert job.cancel_requested_by == w["extra"].get("cancel_requested_by")
            # and nothing new made up: fields added since have their empty values
            assert (job.orphans, job.array_id, job.rerun_of, job.remote_start,
                    job.spec.after, job.spec.time_limit_s) == ((), None, None, None, (), None)
            assert jobs.events(c, job.id) == want["events"]
            # the accounting migration (v7) took held time and first start from the events
            row = c.execute("SELECT held_s, held_since, first_started_at FROM jobs WHERE id=?",
                            (job.id,)).fetchone()
            held, since = _held(want["events"])
            starts = [e["at"] for e in want["events"] if e["new_state"] == "starting"]
            assert row["held_s"] == pytest.approx(held), job.id
            assert row["held_since"] == (since if job.state in ACTIVE else None), job.id
            assert row["first_started_at"] == (min(starts) if starts else None), job.id
        # the events table as a whole: none lost, none added
        assert c.execute("SELECT COUNT(*) FROM events").fetchone()[0] == sum(
            len(e["events"]) for e in expected)
        # and the upgraded database takes new jobs after the old ones, numbered on
        from iadeep_cli.jobs import JobSpec
        new_id, _ = jobs.insert(c, "frank", JobSpec(script="/home/frank/g.sh"), 2e9)
        assert new_id == max(e["job"]["id"] for e in expected) + 1
    store.close()


def test_fixtures_hold_jobs_in_every_state_the_first_release_had():
    """The fixture is worth upgrading: queued, held, running, finished three ways, and a job
    lost then queued again, with every spec field set on one of them."""
    states = {e["job"]["state"] for e in EXPECTED}
    assert states == {"queued", "held", "running", "succeeded", "failed", "cancelled"}
    assert any(e["new_state"] == "lost" for x in EXPECTED for e in x["events"])
    first = EXPECTED[0]["job"]["spec"]
    assert all(v not in (None, (), [], "", 0, False) for k, v in first.items()
               if k != "exclusive")

"""The impact factor's accounting (store/impact.py) over a real SQLite store, against figures
computed by hand from the moves and polls below.

Three jobs on node n1: alice's A and bob's B share GPU 0 for a while, carol's C runs alone on
GPUs 1 and 2. Every move goes through the store's own ``transition`` and every poll through
``impact.tick``, as the controller does them. GPU 0 draws 300 W, GPU 1 100 W, GPU 2 reports no
power.
"""
import math
from datetime import datetime

import pytest

from iadeep_cli.jobs import JobSpec, JobState
from iadeep_cli.snapshot import GpuSample, NodeSnapshot
from iadeep_cli.store import Store, cluster, db, impact, jobrows as jobs
from iadeep_cli.store.report import report

S = JobState
T0 = datetime(2026, 11, 2, 12, 0).timestamp()
POWER = {("n1", 0): 300.0, ("n1", 1): 100.0}


def _start(c, owner, gpus, at, predicted):
    job_id, _ = jobs.insert(c, owner, JobSpec(script="/j.sh", gpus=len(gpus)), T0 + at - 5)
    jobs.transition(c, job_id, S.STARTING, "placed", "ctl", T0 + at - 5, node="n1",
                    gpu_indices=gpus, started_at=T0 + at - 5, predicted_speed=predicted)
    jobs.transition(c, job_id, S.RUNNING, "running", "ctl", T0 + at)
    return job_id


def _end(c, job_id, at):
    jobs.transition(c, job_id, S.SUCCEEDED, "exited with code 0", "ctl", T0 + at,
                    ended_at=T0 + at, exit_code=0)


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as c:
        cluster.save_nodes(c, (NodeSnapshot("n1", T0, tuple(
            GpuSample(i, f"GPU-{i}", "NVIDIA H200", power_draw_w=POWER.get(("n1", i)))
            for i in range(3)), jobs=()),))
        a = _start(c, "alice", (0,), 10, 0.8)       # alone: 1.00 (predicted by definition)
        impact.tick(c, T0 + 20, {}, POWER)
        b = _start(c, "bob", (0,), 30, 0.7)         # A and B share: their predictions
        impact.tick(c, T0 + 40, {a: 0.9}, POWER)    # A reports progress: 0.90 measured
        cj = _start(c, "carol", (1, 2), 40, None)   # alone on two GPUs
        _end(c, a, 50)                              # B alone from here: 1.00
        _end(c, b, 70)
        impact.tick(c, T0 + 80, {}, POWER)
        _end(c, cj, 100)
    yield store
    store.close()


# By hand, in GPU-seconds (work = speed x GPUs x time; busy shared out 1/n on a shared GPU):
# A: 10-30 alone 1.0 (20 work, 20 busy); 30-40 0.8 (8, 5); 40-50 0.9 measured (9, 5)
# B: 30-50 0.7 (14, 10); 50-70 alone 1.0 (20, 20)
# C: 40-100 alone on 2 GPUs (120, 120)
# Energy: GPU 0 300 W shared out (A 10-30: 6000 J, 30-50: 3000 J; B 30-50: 3000, 50-70: 6000);
# C: GPU 1's 100 W for 60 s (GPU 2 reports none): 6000 J.
WORK = {"alice": 37.0, "bob": 34.0, "carol": 120.0}
BUSY = {"alice": 30.0, "bob": 30.0, "carol": 120.0}
MEASURED = {"alice": 9.0, "bob": 0.0, "carol": 0.0}
SHARED = {"alice": (20.0, 17.0), "bob": (20.0, 14.0), "carol": (0.0, 0.0)}
ENERGY_J = {"alice": 9000.0, "bob": 9000.0, "carol": 6000.0}


def test_job_rows_carry_the_hand_computed_totals(store):
    with store.tx() as c:
        rows = {r["owner"]: r for r in c.execute("SELECT * FROM jobs")}
    for owner, row in rows.items():
        assert row["work_s"] == pytest.approx(WORK[owner])
        assert row["busy_s"] == pytest.approx(BUSY[owner])
        assert row["measured_s"] == pytest.approx(MEASURED[owner])
        assert (row["shared_s"], row["shared_work_s"]) == pytest.approx(SHARED[owner])
        assert row["energy_j"] == pytest.approx(ENERGY_J[owner])
        assert row["acct_at"] is None and row["acct_rate"] is None   # finished: not accruing
        # held time (starting + running) and first start kept on the row by the transitions
        assert row["held_s"] == pytest.approx(row["ended_at"] - row["first_started_at"])


def test_busy_time_adds_up_to_the_gpus_busy_time(store):
    with store.tx() as c:
        total = impact.window(c, T0, T0 + 3600)
    # GPU 0 busy 10-70, GPUs 1 and 2 busy 40-100: 180 GPU-seconds
    assert total.busy_s == pytest.approx(180.0)
    assert total.work_s == pytest.approx(191.0)
    assert total.impact_factor == pytest.approx(191.0 / 180.0)
    assert total.saved_s == pytest.approx(11.0)
    assert total.measured_share == pytest.approx(9.0 / 191.0)
    assert total.energy_j == pytest.approx(24000.0)


def test_report_shows_work_saved_impact_sharing_speed_and_energy(store):
    with store.tx() as c:
        rep = report(c, T0, T0 + 3600, by="user", now=T0 + 200)
    by_user = {g.key: g for g in rep.groups}
    for owner, g in by_user.items():
        assert g.work_gpu_hours * 3600 == pytest.approx(WORK[owner])
        assert g.busy_gpu_hours * 3600 == pytest.approx(BUSY[owner])
        assert g.saved_gpu_hours * 3600 == pytest.approx(WORK[owner] - BUSY[owner])
        assert g.impact_factor == pytest.approx(WORK[owner] / BUSY[owner])
        assert g.energy_kwh * 3.6e6 == pytest.approx(ENERGY_J[owner])
        shared_s, shared_work = SHARED[owner]
        if shared_s:
            assert g.sharing_speed == pytest.approx(shared_work / shared_s)
        else:
            assert g.sharing_speed is None
    assert by_user["alice"].sharing_speed == pytest.approx(0.85)   # the slowdown alice paid
    total = rep.total
    assert total.work_gpu_hours * 3600 == pytest.approx(191.0)
    assert total.impact_factor == pytest.approx(191.0 / 180.0)
    assert total.sharing_speed == pytest.approx(31.0 / 40.0)
    assert total.measured_share == pytest.approx(9.0 / 191.0)
    assert total.to_dict()["impact_factor"] == round(191.0 / 180.0, 4)


def test_a_running_job_accrues_each_poll_and_lost_time_is_not_work(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as c:
        a = _start(c, "alice", (0,), 0, None)
        impact.tick(c, T0 + 30, {}, {})
        jobs.transition(c, a, S.LOST, "node silent", "ctl", T0 + 40)
        impact.tick(c, T0 + 100, {}, {})            # lost: the controller cannot know
        jobs.transition(c, a, S.RUNNING, "node answers again", "ctl", T0 + 200)
        impact.tick(c, T0 + 260, {a: 0.5}, {})
        impact.tick(c, T0 + 270, {}, {})            # a poll that could not read its progress
        impact.tick(c, T0 + 280, {}, {})
        row = c.execute("SELECT * FROM jobs WHERE id=?", (a,)).fetchone()
        # 0-40 and 200-260 alone (1.00 predicted), 260-280 at 0.5 measured (kept while the
        # polls at 270 and 280 read no progress: its company did not change)
        assert row["work_s"] == pytest.approx(100.0 + 10.0)
        assert row["busy_s"] == pytest.approx(120.0)
        assert row["measured_s"] == pytest.approx(10.0)
        assert row["energy_j"] is None              # no poll saw its GPU's power
        assert row["acct_at"] == T0 + 280           # still running: accounted up to now
        # its held time: 5 s starting + 40 s running, then running again since 200
        assert row["held_s"] == pytest.approx(45.0) and row["held_since"] == T0 + 200
    store.close()


def test_spread_cuts_an_interval_into_buckets():
    now = T0 + 10 * 86400 + 17
    parts = impact._spread(now - 3 * 86400 - 100, now)   # a controller down for three days
    assert math.fsum(f for _, f in parts) == pytest.approx(1.0)
    spans = [span for (span, _), _ in parts]
    assert spans == sorted(spans, reverse=True) and set(spans) == {60, 3600}
    assert all(start >= now - impact.KEEP_MINUTES_S - 3600 for (span, start), _ in parts
               if span == 60)


def test_compact_folds_old_minutes_into_hours_keeping_the_totals(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as c:
        a = _start(c, "alice", (0,), 0, None)
        impact.tick(c, T0 + 7200, {}, {})
        before = impact.window(c, T0 - 3600, T0 + 4 * 86400)
        minutes = c.execute("SELECT COUNT(*) FROM usage WHERE span = 60").fetchone()[0]
        impact.compact(c, T0 + 4 * 86400)           # two days later: all folded into hours
        after = impact.window(c, T0 - 3600, T0 + 4 * 86400)
        rows = c.execute("SELECT span, COUNT(*) FROM usage GROUP BY span").fetchall()
    assert minutes == 120 and [tuple(r) for r in rows] == [(3600, 2)]  # 12:00 to 14:00
    assert (after.busy_s, after.work_s) == pytest.approx((before.busy_s, before.work_s))
    assert after.busy_s == pytest.approx(7200.0) and a
    store.close()


def test_upgrade_takes_held_time_and_first_start_from_the_events(tmp_path):
    path = tmp_path / "iadeep.db"
    conn = db.connect(path, migrate_to=6)            # a database from before the accounting
    conn.execute("INSERT INTO jobs (id, owner, script, state, submitted_at, started_at, "
                 "ended_at, node) VALUES (1, 'a', '/j', 'succeeded', 0, 300, 900, 'n'), "
                 "(2, 'a', '/j', 'running', 0, 500, NULL, 'n'), "
                 "(3, 'a', '/j', 'failed', 0, 100, 160, 'n')")   # 3: no events (by hand)
    conn.executemany("INSERT INTO events (job_id, at, old_state, new_state) VALUES (?,?,?,?)", [
        (1, 0, None, "queued"), (1, 100, "queued", "starting"), (1, 101, "starting", "running"),
        (1, 200, "running", "lost"), (1, 250, "lost", "queued"), (1, 300, "queued", "starting"),
        (1, 300, "starting", "running"), (1, 900, "running", "succeeded"),
        (2, 0, None, "queued"), (2, 400, "queued", "starting"), (2, 410, "starting", "running"),
        (2, 450, "running", "lost"), (2, 500, "lost", "running")])
    conn.close()
    conn = db.connect(path)
    rows = {r["id"]: r for r in conn.execute("SELECT * FROM jobs")}
    assert (rows[1]["held_s"], rows[1]["first_started_at"], rows[1]["held_since"]) == (
        100 + 600, 100, None)
    assert (rows[2]["held_s"], rows[2]["first_started_at"], rows[2]["held_since"]) == (
        50, 400, 500)
    assert (rows[3]["held_s"], rows[3]["first_started_at"]) == (60, 100)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    conn.close()

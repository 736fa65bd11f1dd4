"""Fair share (lab.policy.fairshare): the inventory's settings, the decayed usage, the factor,
the queue order it gives plan() and the simulator, and what `queue why` is told.

Expected figures are worked out here by hand from the formula in docs/scheduling.md (closed-form
integrals and powers of two), never taken from the code under test; the usage comes from a real
SQLite database written through the store's own transitions.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from iadeep_cli import messages as m
from iadeep_cli.controller.fairshare import FairShareRound, priority_view
from iadeep_cli.controller.requests.views import StoreReader
from iadeep_cli.errors import ConfigError, InputError
from iadeep_cli.inventory import parse_inventory
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler.fairshare import UsageLedger, decayed, points, shares
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, plan
from iadeep_cli.scheduler.priority import effective_priority, order_queue
from iadeep_cli.settings import FairShare, Inventory, Policy
from iadeep_cli.sim.engine import SimJob, load_trace, make_planner, simulate
from iadeep_cli.sim.run import SimSettings, format_table, run_sim
from iadeep_cli.sim.truth import TruthModel
from iadeep_cli.store import Store, cluster, jobrows, usage

H = 3600.0
DAY = 86400.0
WEEK = 7 * DAY
ON = FairShare()                       # half-life 7 d, weight 10, equal shares


# --------------------------------------------------------------------------- inventory
def _policy(text: str) -> Policy:
    return parse_inventory(f"lab:\n  policy:\n{text}", Path("lab/nodes.yaml")).policy


def test_fairshare_is_off_unless_the_inventory_has_it():
    assert _policy("    aging_per_hour: 1\n").fairshare is None
    assert _policy("    fairshare: {}\n").fairshare == FairShare(7.0, 10.0, ())
    fs = _policy("    fairshare: {half_life_days: 3.5, weight: 20, shares: {alice: 2, bob: 0.5}}\n"
                 ).fairshare
    assert fs == FairShare(3.5, 20.0, (("alice", 2.0), ("bob", 0.5)))
    assert fs.share("alice") == 2 and fs.share("carol") == 1 and fs.half_life_s == 3.5 * DAY
    hash(_policy("    fairshare: {shares: {alice: 2}}\n"))   # the policy stays a value


@pytest.mark.parametrize("text, expected", [
    ("    fairshare: {half_life_days: 0}\n",
     "3: lab.policy.fairshare.half_life_days: expected a number > 0, got 0"),
    ("    fairshare: {weight: -1}\n", "3: lab.policy.fairshare.weight: expected a number >= 0"),
    ("    fairshare: {weight: .nan}\n", "3: lab.policy.fairshare.weight: expected a number >= 0"),
    ("    fairshare: {weight: ten}\n",
     "3: lab.policy.fairshare.weight: expected a number, got 'ten'"),
    ("    fairshare: {shares: {alice: 0}}\n",
     "3: lab.policy.fairshare.shares.alice: expected a number > 0, got 0"),
    ("    fairshare: {shares: [alice]}\n",
     "3: lab.policy.fairshare.shares: expected a mapping of user: share, e.g. {alice: 2}"),
    ("    fairshare: {shares: {alice: 1, alice: 2}}\n",
     "3: lab.policy.fairshare.shares.alice: given twice"),
    ("    fairshare: {halflife: 3}\n",
     "3: lab.policy.fairshare.halflife: unknown key 'halflife' (allowed: half_life_days, "
     "shares, weight)"),
    ("    fairshare:\n", "3: lab.policy.fairshare: expected a mapping such as"),
])
def test_bad_fairshare_settings_are_one_line_naming_the_field(text, expected):
    with pytest.raises(ConfigError) as info:
        _policy(text)
    assert info.value.message.startswith(f"lab/nodes.yaml:{expected}")
    assert "\n" not in info.value.message


# --------------------------------------------------------------------------- decayed usage
def test_a_gpu_hour_counts_half_after_one_half_life():
    ledger = UsageLedger(WEEK)
    ledger.start(1, "alice", 2, 0.0)
    ledger.stop(1, 60.0)                   # 2 GPUs for a minute: 120 GPU-seconds
    assert ledger.usage(60.0)["alice"] == pytest.approx(120.0, rel=1e-4)
    assert ledger.usage(60.0 + WEEK)["alice"] == pytest.approx(60.0, rel=1e-4)
    assert ledger.usage(60.0 + 3 * WEEK)["alice"] == pytest.approx(15.0, rel=1e-4)


def test_usage_is_the_integral_of_the_decay_over_the_time_held():
    """100 GPU-hours run over the past 100 hours, seen at the end: by hand,
    integral_0^T 2^(-(T-t)/h) dt = h/ln2 (1 - 2^(-T/h)), and a numerical sum agrees."""
    t_end = 100 * H
    by_hand = WEEK / math.log(2) * (1 - 2 ** (-t_end / WEEK))
    steps = 100_000
    riemann = sum(2 ** (-(t_end - (i + 0.5) * t_end / steps) / WEEK)
                  for i in range(steps)) * t_end / steps
    assert by_hand == pytest.approx(riemann, rel=1e-6)
    assert decayed(0.0, t_end, 1, t_end, WEEK) == pytest.approx(by_hand, rel=1e-9)
    ledger = UsageLedger(WEEK)
    ledger.start(7, "alice", 1, 0.0)       # still running: counted up to now
    assert ledger.usage(t_end)["alice"] == pytest.approx(by_hand, rel=1e-9)
    ledger.stop(7, t_end)
    assert ledger.usage(t_end)["alice"] == pytest.approx(by_hand, rel=1e-9)
    assert by_hand / H == pytest.approx(81.94, abs=0.01)   # what `queue why` shows for it


def test_restarts_of_a_job_and_time_not_holding_gpus():
    """starting -> running is one interval; lost -> running starts another; queued/held
    moves count nothing (the event stream the store gives)."""
    moves = [(1, 5, "bob", 1.0, 0.0, "queued", "starting"),
             (2, 5, "bob", 1.0, 10.0, "starting", "running"),   # not a boundary
             (3, 5, "bob", 1.0, 100.0, "running", "lost"),
             (4, 5, "bob", 1.0, 500.0, "lost", "running"),
             (5, 5, "bob", 1.0, 600.0, "running", "succeeded")]
    ledger = UsageLedger(1e12)             # no decay to speak of: plain GPU-seconds
    ledger.feed(moves)
    assert ledger.usage(1000.0)["bob"] == pytest.approx(100.0 + 100.0, rel=1e-6)
    assert ledger.cursor == 5


def test_old_usage_is_forgotten_and_a_later_clock_reading_is_exact():
    ledger = UsageLedger(DAY)
    ledger.start(1, "alice", 1, 0.0)
    ledger.stop(1, H)
    assert "alice" not in ledger.usage(40 * DAY)   # 3600 x 2^-40: below a GPU-millisecond
    ledger = UsageLedger(DAY)
    ledger.start(1, "alice", 1, 0.0)
    ledger.stop(1, H)
    first = ledger.usage(2 * DAY)["alice"]
    assert ledger.usage(DAY)["alice"] == pytest.approx(first * 2, rel=1e-9)   # asked earlier


# --------------------------------------------------------------------------- the factor
def test_slurms_classic_factor_two_users_equal_shares():
    table = shares({"alice": 100 * H}, ["alice", "bob"], ON)
    a, b = table["alice"], table["bob"]
    assert (a.usage_norm, a.share_norm, b.usage_norm, b.share_norm) == (1.0, 0.5, 0.0, 0.5)
    assert a.factor == pytest.approx(2 ** -2) and b.factor == 1.0
    assert points(table) == {"alice": pytest.approx(2.5), "bob": pytest.approx(10.0)}
    assert a.usage_gpu_h == pytest.approx(100.0)


def test_shares_weight_the_factor_and_unlisted_users_have_one():
    settings = FairShare(weight=4, shares=(("alice", 3.0),))
    table = shares({"alice": 30.0, "bob": 10.0}, ["bob"], settings)
    # alice counts though she waits for nothing: she is in `shares` and has usage
    assert set(table) == {"alice", "bob"}
    assert table["alice"].share_norm == 0.75 and table["bob"].share_norm == 0.25
    assert table["alice"].factor == pytest.approx(2 ** -(0.75 / 0.75))
    assert table["bob"].factor == pytest.approx(2 ** -(0.25 / 0.25))
    assert table["bob"].points == pytest.approx(4 * 0.5)


def test_nobody_used_anything_means_nobody_is_lowered():
    table = shares({}, ["alice", "bob"], ON)
    assert {u: s.factor for u, s in table.items()} == {"alice": 1.0, "bob": 1.0}


# --------------------------------------------------------------------------- queue order
def _job(id, owner, t=0.0, prio=0):
    return Job(id, owner, JobSpec(f"/s/{id}.sh", workload="resnet18", priority=prio),
               JobState.QUEUED, t)


def _slot(index=0):
    return GpuSlot("a", index, 141 * 1024.0, 140 * 1024.0)


def _plan(queue, now, fair):
    truth = TruthModel(shipped_pairs(), shipped_triples())
    return plan(queue, [_slot()], [], now,
                PlanInputs(shipped_profiles(), truth, Policy(), fairshare=fair))


def test_a_user_who_ran_100_gpu_hours_waits_behind_one_who_ran_none():
    ledger = UsageLedger(ON.half_life_s)
    for i in range(25):                    # alice: 25 jobs x 4 GPU-hours over the week
        ledger.start(100 + i, "alice", 1, i * 6 * H)
        ledger.stop(100 + i, i * 6 * H + 4 * H)
    now = 7 * DAY
    fair = points(shares(ledger.usage(now), ["alice", "bob"], ON))
    heavy, light = _job(1, "alice", t=now - 60), _job(2, "bob", t=now - 30)
    assert [j.id for j in order_queue([heavy, light], Policy(), now)] == [1, 2]   # FIFO
    assert [j.id for j in order_queue([heavy, light], Policy(), now, fair)] == [2, 1]
    assert _plan([heavy, light], now, fair).placements[0].job_id == 2
    assert _plan([heavy, light], now, None).placements[0].job_id == 1   # off: as before


def test_aging_still_lets_the_heavy_users_job_through():
    """Fair share moves a job by at most `weight` points; aging gives 1 point an hour, so a
    heavy user's job that has waited weight/aging_per_hour hours longer than a newcomer
    of the lightest user goes first: no starvation."""
    fair = points(shares({"alice": 1e9}, ["alice", "bob"], ON))
    gap = fair["bob"] - fair["alice"]
    assert 0 < gap < ON.weight
    now = 100 * H
    newcomer = _job(2, "bob", t=now)
    behind = _job(1, "alice", t=now - (gap - 0.1) * H)   # not yet
    ahead = _job(1, "alice", t=now - (gap + 0.1) * H)    # waited long enough
    assert [j.id for j in order_queue([behind, newcomer], Policy(), now, fair)] == [2, 1]
    assert [j.id for j in order_queue([ahead, newcomer], Policy(), now, fair)] == [1, 2]
    assert _plan([ahead, newcomer], now, fair).placements[0].job_id == 1
    assert effective_priority(ahead, Policy(), now, fair) == pytest.approx(
        (gap + 0.1) + fair["alice"])


# --------------------------------------------------------------------------- from the database
def _run_job(conn, owner, start, end, gpus=1, submitted=None):
    job_id, _ = jobrows.insert(conn, owner, JobSpec("/j.sh", gpus=gpus),
                               start if submitted is None else submitted)
    jobrows.transition(conn, job_id, JobState.STARTING, "placed", "ctl", start, node="n",
                       gpu_indices=tuple(range(gpus)))
    jobrows.transition(conn, job_id, JobState.RUNNING, "started", "ctl", start + 5)
    if end is not None:
        jobrows.transition(conn, job_id, JobState.SUCCEEDED, "exit 0", "ctl", end)
    return job_id


def test_usage_comes_from_the_recorded_events(tmp_path):
    store = Store(tmp_path / "s.db")
    now = 10 * DAY
    with store.tx() as c:
        _run_job(c, "alice", now - 3 * DAY, now - 2 * DAY, gpus=2)   # finished
        _run_job(c, "bob", now - H, None)                             # running now
        queued, _ = jobrows.insert(c, "carol", JobSpec("/j.sh"), now - 60)
        ledger = UsageLedger(WEEK)
        ledger.feed(usage.moves_after(c, 0))
        assert usage.owners_with_jobs(c) == {"bob", "carol"}
    got = ledger.usage(now)
    assert got["alice"] == pytest.approx(2 * decayed(now - 3 * DAY, now - 2 * DAY, 1, now, WEEK))
    assert got["bob"] == pytest.approx(decayed(now - H, now, 1, now, WEEK))
    # A later round reads only what happened since, and agrees with a fresh ledger.
    with store.tx() as c:
        jobrows.transition(c, queued, JobState.STARTING, "placed", "ctl", now + 10, node="n",
                           gpu_indices=(0,))
        ledger.feed(usage.moves_after(c, ledger.cursor))
        fresh = UsageLedger(WEEK)
        fresh.feed(usage.moves_after(c, 0))
        assert usage.moves_after(c, ledger.cursor) == []
    assert ledger.usage(now + H) == pytest.approx(fresh.usage(now + H))
    assert ledger.usage(now + H)["carol"] == pytest.approx(decayed(now + 10, now + H, 1,
                                                                   now + H, WEEK))
    store.close()


def test_the_first_round_sums_the_history_in_sqlite_to_the_same_figures(tmp_path):
    """``history`` + ``restore`` (the first round) and feeding every move one by one (what
    later rounds do) agree: finished, requeued (lost time not counted) and running jobs."""
    store = Store(tmp_path / "s.db")
    now = 30 * DAY
    with store.tx() as c:
        _run_job(c, "alice", now - 20 * DAY, now - 19 * DAY, gpus=4)
        _run_job(c, "alice", now - 2 * H, None, gpus=2)                  # holds GPUs now
        lost = _run_job(c, "bob", now - 5 * DAY, None)
        jobrows.transition(c, lost, JobState.LOST, "silent", "ctl", now - 4 * DAY)
        jobrows.transition(c, lost, JobState.QUEUED, "requeued", "ctl", now - 3 * DAY)
        jobrows.transition(c, lost, JobState.STARTING, "placed", "ctl", now - 2 * DAY, node="n",
                           gpu_indices=(0,))
        jobrows.transition(c, lost, JobState.FAILED, "exit 1", "ctl", now - DAY)
        summed = UsageLedger(WEEK)
        summed.restore(*_history(c, now))
        fed = UsageLedger(WEEK)
        fed.feed(usage.moves_after(c, 0))
        assert summed.cursor == fed.cursor == c.execute("SELECT MAX(id) FROM events").fetchone()[0]
    for t in (now, now + DAY):
        assert summed.usage(t) == pytest.approx(fed.usage(t), rel=1e-9)
    bob = decayed(now - 5 * DAY, now - 4 * DAY, 1, now, WEEK) + decayed(now - 2 * DAY, now - DAY,
                                                                      1, now, WEEK)
    assert summed.usage(now)["bob"] == pytest.approx(bob, rel=1e-9)
    alice = 4 * decayed(now - 20 * DAY, now - 19 * DAY, 1, now, WEEK) + decayed(
        now - 2 * H, now, 2, now, WEEK)
    assert summed.usage(now)["alice"] == pytest.approx(alice, rel=1e-9)
    summed.stop(2, now + H)                # the running job ends: its interval closes
    assert summed.usage(now + H)["alice"] == pytest.approx(
        decayed(now - 20 * DAY, now - 19 * DAY, 4, now + H, WEEK)
        + decayed(now - 2 * H, now + H, 2, now + H, WEEK), rel=1e-9)
    store.close()


def _history(conn, now):
    cursor, sums, held = usage.history(conn, now, WEEK)
    return cursor, now, sums, held


def test_each_round_records_the_table_and_queue_why_reads_it(tmp_path):
    store = Store(tmp_path / "s.db")
    now = 7 * DAY
    with store.tx() as c:
        _run_job(c, "alice", now - 100 * H, now)                    # 100 GPU-hours this week
        waiting, _ = jobrows.insert(c, "alice", JobSpec("/j.sh", priority=3), now - 2 * H)
        jobrows.insert(c, "bob", JobSpec("/j.sh"), now - H)
    inventory = Inventory(nodes=(), policy=Policy(fairshare=ON, aging_per_hour=0.5))
    got = FairShareRound().points(store, inventory.policy, now)
    hand = WEEK / math.log(2) * (1 - 2 ** (-100 * H / WEEK))   # alice's decayed GPU-seconds
    assert got == {"alice": pytest.approx(10 * 2 ** -2), "bob": pytest.approx(10.0)}
    detail = StoreReader(store, clock=lambda: now + H, inventory=inventory).job(waiting)
    p = detail.priority
    assert p is not None and p.fairshare_on and p.fairshare is not None
    assert (p.base, p.aging, p.aging_per_hour) == (3, pytest.approx(1.5), 0.5)   # 3 h x 0.5
    assert p.fairshare.usage_gpu_h == pytest.approx(hand / H)
    assert p.fairshare.factor == pytest.approx(0.25) and p.fairshare.share_norm == 0.5
    assert p.effective == pytest.approx(3 + 1.5 + 2.5)
    # the same parts travel to the client and come back (`queue show --json`)
    wire = m.JobDetail.from_dict(detail.to_dict())
    assert wire == detail and detail.to_dict()["effective_priority"]["fairshare"]["user"] == \
        "alice"
    # offline (no inventory): the heartbeat's aging and the last round's record
    with store.tx() as c:
        cluster.set_meta(c, "controller", m.ControllerView(heartbeat_at=now,
                                                           aging_per_hour=2.0).to_dict())
        offline = priority_view(c, detail.job, now + H, None)
    assert offline is not None and offline.aging == pytest.approx(6.0)
    assert offline.fairshare == p.fairshare
    # `status` carries every user's points (the monitor orders the queue by them), online
    # and offline, and through the wire
    for reader in (StoreReader(store, clock=lambda: now + H, inventory=inventory),
                   StoreReader(store, clock=lambda: now + H)):
        points = m.StatusView.from_dict(reader.status().to_dict()).fairshare_points
        assert points == {"alice": pytest.approx(2.5), "bob": pytest.approx(10.0)}
    # switched off on a reload: the record goes, and readers show no fair-share part
    off = Policy(aging_per_hour=0.5)
    assert FairShareRound().points(store, off, now) is None
    with store.tx() as c:
        assert cluster.get_meta(c, "fairshare") is None
        view = priority_view(c, detail.job, now + H, None)
    assert view is not None and not view.fairshare_on and view.fairshare is None
    assert StoreReader(store, clock=lambda: now + H).status().fairshare_points is None
    assert StoreReader(store, clock=lambda: now + H, inventory=Inventory(
        nodes=(), policy=off)).status().fairshare_points is None
    store.close()


def test_the_record_is_rewritten_only_when_what_it_says_changed(tmp_path):
    """Each write is a commit with fsync: a round that changes nothing a reader would see
    keeps the last record; a new user, a moved figure or 30 s rewrite it."""
    store = Store(tmp_path / "s.db")
    now = 7 * DAY
    with store.tx() as c:
        _run_job(c, "alice", now - 10 * H, now)
        jobrows.insert(c, "alice", JobSpec("/j.sh"), now)
    policy = Policy(fairshare=ON)
    rounds = FairShareRound()

    def recorded_at():
        with store.tx() as c:
            return cluster.get_meta(c, "fairshare")["at"]
    rounds.points(store, policy, now)
    rounds.points(store, policy, now + 10)
    assert recorded_at() == now                      # nothing moved
    with store.tx() as c:
        jobrows.insert(c, "bob", JobSpec("/j.sh"), now + 15)
    rounds.points(store, policy, now + 20)
    assert recorded_at() == now + 20                 # bob counts now: alice's share halves
    rounds.points(store, policy, now + 50)
    assert recorded_at() == now + 50                 # 30 s since the last write
    store.close()


def test_a_finished_job_has_no_effective_priority(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as c:
        done = _run_job(c, "alice", 0.0, 10.0)
    inventory = Inventory(nodes=(), policy=Policy(fairshare=ON))
    assert StoreReader(store, inventory=inventory).job(done).priority is None
    assert "effective_priority" not in StoreReader(store, inventory=inventory).job(
        done).to_dict()
    store.close()


# --------------------------------------------------------------------------- the simulator
def _trace(tmp_path, rows):
    path = tmp_path / "t.csv"
    path.write_text("submit_s,workload,duration_s,gpus,user\n" + "".join(
        f"{r[0]},{r[1]},{r[2]},1,{r[3]}\n" for r in rows))
    return path


def test_a_multi_user_trace_with_and_without_fair_share(tmp_path):
    """Two GPUs; alice queues 8 two-hour jobs at once, bob a half-hour job every hour.
    Without fair share bob's jobs queue behind alice's whole batch; with it each goes at the
    next free GPU (alice's batch is shorter than the weight/aging horizon of 10 h)."""
    rows = [(i, "resnet50", 2 * H, "alice") for i in range(8)]
    rows += [(H / 2 + H * k, "resnet18", H / 2, "bob") for k in range(6)]
    jobs = load_trace(_trace(tmp_path, rows), shipped_profiles())
    assert {j.user for j in jobs} == {"alice", "bob"}
    truth = TruthModel(shipped_pairs(), shipped_triples())
    waits = {}
    for label, fair in (("off", None), ("on", ON)):
        policy = Policy(fairshare=fair)
        planner = make_planner("exclusive", shipped_profiles(), truth, truth, policy,
                               {j.id: 0.0 for j in jobs}, 0)
        r = simulate(jobs, planner, truth, gpus=2, policy=policy, profiles=shipped_profiles(),
                     name=label)
        waits[label] = r.user_waits
        assert len(r.jcts) == len(jobs)     # nobody starves: every job ran
    assert waits["on"]["bob"] < waits["off"]["bob"] / 2
    assert waits["on"]["alice"] > waits["off"]["alice"]


def test_a_trace_without_users_is_one_user_and_a_bad_user_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("submit_s,workload,duration_s\n0,mlp,60\n")
    assert [j.user for j in load_trace(path, shipped_profiles())] == ["sim"]
    bad = _trace(tmp_path, [(0, "mlp", 60, "al ice")])
    with pytest.raises(InputError, match=r"t.csv:2: user: expected a user name without "
                                         r"spaces, got 'al ice'"):
        load_trace(bad, shipped_profiles())
    assert SimJob(1, 0.0, "mlp", 1.0).user == "sim"


def test_sim_fairshare_runs_each_policy_both_ways_and_shows_each_users_wait(tmp_path):
    rows = [(i, "resnet50", 2 * H, "alice") for i in range(4)]
    rows += [(H / 2, "resnet18", H / 2, "bob")]
    path = _trace(tmp_path, rows)
    report = run_sim(SimSettings(trace=str(path), gpus=1, policies=("exclusive",),
                                 fairshare=ON))
    assert [r.name for r in report.results] == ["exclusive", "exclusive+fs"]
    assert report.users == {"alice": (4, 8.0), "bob": (1, 0.5)}
    off, on = report.results
    # one GPU: without fair share bob waits for all of alice's jobs before his (FIFO), with it
    # only for the one running when he arrived
    assert off.user_waits["bob"] == pytest.approx(8 * H - H / 2)
    assert on.user_waits["bob"] == pytest.approx(2 * H - H / 2)
    table = format_table(report)
    assert "mean queue wait per user" in table
    line = next(x for x in table.splitlines() if x.startswith("bob "))
    assert line.split() == ["bob", "1", "0.5", "7.50", "1.50"]
    assert report.to_dict()["policies"]["exclusive+fs"]["avg_wait_s_by_user"]["bob"] == \
        pytest.approx(1.5 * H)

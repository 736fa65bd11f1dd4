"""Run-time adaptation, phase changes (scheduler/detectors.PhaseDetector): a job whose rate or
GPU signature (alone, or its utilisation alone estimated while it shares) moved away from how
it started and from its profile, persistently, is a phase change; the shipped measurements'
jitter never is."""
import csv
import random
from pathlib import Path

import pytest

from iadeep_cli.errors import ConfigError, NotFoundError
from iadeep_cli.inventory import parse_inventory
from iadeep_cli.scheduler.detectors import (
    MEM,
    RATE,
    UTIL,
    PhaseDetector,
    Solo,
    phase_shift,
    solo_util,
)
from iadeep_cli.settings import AdaptPolicy

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
FAST = AdaptPolicy(polls=3, phase_persist_s=30)


def solo(rate=None, util=None, mem=None, p_rate=100.0, p_util=80.0, p_mem=40.0, **kw) -> Solo:
    return Solo(1, "w", rate, util, mem, p_rate, p_util, p_mem, **kw)


def test_a_shift_needs_both_a_change_from_the_start_and_from_the_profile():
    start = {RATE: 100.0, UTIL: 80.0}
    assert phase_shift(solo(60.0, 80.0), start, FAST) == {RATE: 60.0}
    assert phase_shift(solo(90.0, 85.0), start, FAST) == {}            # within the threshold
    assert phase_shift(solo(100.0, 30.0), start, FAST) == {UTIL: 30.0}
    # it always ran at 60 (another batch size than the profile's job): no change of phase
    assert phase_shift(solo(60.0), {RATE: 60.0}, FAST) == {}
    # a warm-up at 60, now back at its profile's 100: nothing to refresh
    assert phase_shift(solo(100.0), {RATE: 60.0}, FAST) == {}
    # a profile without a rate (a shipped one): the job's own start is the reference
    assert phase_shift(solo(60.0, p_rate=None), {RATE: 100.0}, FAST) == {RATE: 60.0}


def test_a_phase_change_must_last_the_time_and_the_polls_and_is_reported_once():
    det = PhaseDetector()
    assert det.observe(0, [solo(100.0, 80.0)], FAST) == []       # its start
    assert det.observe(10, [solo(50.0, 80.0)], FAST) == []
    assert det.observe(20, [solo(52.0, 80.0)], FAST) == []
    assert det.observe(30, [solo(48.0, 80.0)], FAST) == []       # 3 polls, 20 s
    [change] = det.observe(40, [solo(50.0, 80.0)], FAST)
    assert (change.job_id, change.old, change.new, change.polls) == (1, {RATE: 100.0},
                                                                     {RATE: 50.0}, 4)
    text = change.describe(40)
    assert text == ("phase change: job 1 (w) alone: progress rate 100 it/s -> 50 it/s "
                    "for 30 s over 4 polls")
    # the new rate is its start now: even if its profile could not be refreshed, not again
    for t in range(50, 200, 10):
        assert det.observe(t, [solo(50.0, 80.0)], FAST) == []


def test_one_normal_poll_breaks_the_streak_and_missing_data_does_not():
    det = PhaseDetector()
    det.observe(0, [solo(100.0)], FAST)
    det.observe(10, [solo(50.0)], FAST)
    det.observe(20, [solo(50.0)], FAST)
    det.observe(30, [solo(99.0)], FAST)                          # back: streak broken
    assert det.observe(40, [solo(50.0)], FAST) == []
    assert det.observe(50, [solo()], FAST) == []                 # nothing measured
    assert det.observe(60, [solo(50.0)], FAST) == []
    assert det.observe(70, [solo(50.0)], FAST)[0].since == 40    # 40..70, polls 40, 60, 70 + 1


def test_opted_out_disabled_and_ended_jobs_are_not_acted_on():
    for policy, kw in ((FAST, {"adapt": False}), (AdaptPolicy(polls=3, phase_persist_s=30,
                                                              phase=False), {}),
                       (AdaptPolicy(polls=3, phase_persist_s=30, enabled=False), {})):
        det = PhaseDetector()
        for t in range(0, 200, 10):
            rate = 100.0 if t == 0 else 30.0
            assert det.observe(t, [solo(rate, **kw)], policy) == []
    det = PhaseDetector()
    det.observe(0, [solo(100.0)], FAST, alive={1})
    det.observe(10, [], FAST, alive=set())          # it ended: its start is forgotten
    assert det.observe(20, [solo(30.0)], FAST, alive={1}) == []    # a new start


def test_a_sharing_jobs_utilisation_alone_is_its_sm_share_over_its_speed():
    assert solo_util(24.0, 0.4) == pytest.approx(60.0)
    assert solo_util(90.0, 0.5) == 100.0                 # no more than the whole GPU
    assert solo_util(None, 0.5) is None and solo_util(20.0, None) is None
    assert solo_util(5.0, 0.05) is None                  # nearly stalled: the quotient is noise
    # at the observer's cap (controller/round/observer.py) a speed is only a floor: no estimate
    assert solo_util(30.0, 1.5) is None and solo_util(30.0, 1.2) == pytest.approx(25.0)


def test_a_sharing_job_changes_phase_on_its_estimate_and_says_so():
    det = PhaseDetector()

    def sharing(sm_share: float, speed: float) -> Solo:
        return Solo(1, "w", util=solo_util(sm_share, speed), profile_util=20.0, sharing=True)

    assert det.observe(0, [sharing(10.0, 0.5)], FAST) == []        # 20% alone: its start
    found = [c for t in (10, 20, 30, 40) for c in det.observe(t, [sharing(40.0, 0.5)], FAST)]
    [change] = found
    assert change.sharing and change.old == {UTIL: 20.0} and change.new == {UTIL: 80.0}
    assert change.describe(40) == (
        "phase change: job 1 (w) sharing its GPU (utilisation alone estimated from its own "
        "SM share and speed): GPU utilisation 20% -> 80% for 30 s over 4 polls")


def test_signature_changes_count_too():
    det = PhaseDetector()
    det.observe(0, [solo(util=80.0, mem=40.0)], FAST)
    found = []
    for t in range(10, 60, 10):
        found += det.observe(t, [solo(util=35.0, mem=70.0)], FAST)
    [change] = found
    assert change.old == {UTIL: 80.0, MEM: 40.0} and change.new == {UTIL: 35.0, MEM: 70.0}
    assert "GPU utilisation 80% -> 35%" in change.describe(50)


def _shipped_profiles() -> list[dict]:
    with open(ROOT / "iadeep_cli/data/h200/profiles.csv", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("seed", range(5))
def test_the_shipped_measurements_jitter_triggers_no_phase_change(seed):
    """Every shipped workload alone, its rate and utilisations observed with the measurements'
    +-2% spread, for two hours of 10 s polls with the default policy: no phase change; the same
    jobs really changing phase are found (so this could fail)."""
    rng = random.Random(seed)
    rows = _shipped_profiles()
    assert len(rows) >= 7
    policy = AdaptPolicy()

    def jitter(v: float) -> float:
        return v * rng.uniform(0.98, 1.02)

    det = PhaseDetector()
    for t in range(0, 7200, 10):
        solos = [Solo(i, r["workload"], jitter(float(r["solo_it_per_s"])),
                      jitter(float(r["gpu_util"])), jitter(float(r["mem_util"])),
                      float(r["solo_it_per_s"]), float(r["gpu_util"]), float(r["mem_util"]))
                 for i, r in enumerate(rows)]
        assert det.observe(float(t), solos, policy) == []
    found = []
    for t in range(7200, 8400, 10):   # every job now runs at 60% of its rate
        solos = [Solo(i, r["workload"], 0.6 * jitter(float(r["solo_it_per_s"])), None, None,
                      float(r["solo_it_per_s"])) for i, r in enumerate(rows)]
        found += det.observe(float(t), solos, policy)
    assert sorted(c.job_id for c in found) == list(range(len(rows)))


@pytest.mark.parametrize("seed", range(3))
def test_sharing_jobs_estimates_under_the_jitter_trigger_no_phase_change(seed):
    """Every shipped pair sharing a GPU for two hours of 10 s polls, each job's SM share (its
    utilisation alone times its measured speed) and its speed each observed with the
    measurements' +-2% spread: no phase change; the first job of each pair then really doing
    the work of a workload 40 points busier is found (so this could fail)."""
    rng = random.Random(seed)
    util = {r["workload"]: float(r["gpu_util"]) for r in _shipped_profiles()}
    with open(ROOT / "iadeep_cli/data/h200/pairs.csv", encoding="utf-8") as fh:
        pairs = [(r["job_a"], r["job_b"], float(r["speed_a"]), float(r["speed_b"]))
                 for r in csv.DictReader(fh)]
    assert len(pairs) >= 20

    def jitter(v: float) -> float:
        return v * rng.uniform(0.98, 1.02)

    def poll(extra: float) -> list[Solo]:
        out = []
        for i, (a, b, sa, sb) in enumerate(pairs):
            for k, (w, speed, more) in enumerate(((a, sa, extra), (b, sb, 0.0))):
                true = min(100.0, util[w] + more)
                out.append(Solo(2 * i + k, w, util=solo_util(jitter(true * speed), jitter(speed)),
                                profile_util=util[w], sharing=True))
        return out

    det = PhaseDetector()
    for t in range(0, 7200, 10):
        assert det.observe(float(t), poll(0.0), AdaptPolicy()) == []
    found = []
    for t in range(7200, 8400, 10):
        found += det.observe(float(t), poll(40.0), AdaptPolicy())
    # (a workload over 75% alone has no room for 25 points more: its change may stay unseen)
    moved = {2 * i for i, (a, *_) in enumerate(pairs) if util[a] < 75.0}
    assert moved
    assert {c.job_id for c in found} >= moved and all(c.job_id % 2 == 0 for c in found)


def test_phase_settings_in_the_inventory():
    inv = parse_inventory("lab:\n  policy:\n    adapt: {phase_threshold: 0.5, phase_util: 30, "
                          "phase_persist_s: 60, phase: false}\nnodes: []\n", Path("nodes.yaml"))
    a = inv.policy.adapt
    assert (a.phase_threshold, a.phase_util, a.phase_persist_s, a.phase) == (0.5, 30, 60, False)
    d = AdaptPolicy()
    assert (d.phase_threshold, d.phase_util, d.phase_persist_s, d.phase) == (0.25, 20, 600, True)
    for text, expected in (
            ("phase_threshold: 0.01", "phase_threshold: expected a relative rate change in "
                                      "[0.05, 10)"),
            ("phase_util: 1", "phase_util: expected percentage points in [5, 100]"),
            ("phase_persist_s: -1", "phase_persist_s: expected a number >= 0")):
        with pytest.raises(ConfigError) as info:
            parse_inventory(f"lab:\n  policy:\n    adapt: {{{text}}}\n", Path("nodes.yaml"))
        assert expected in info.value.message


def test_a_phase_sample_replaces_the_profile_and_learning_restarts_from_it(tmp_path):
    """store/profiles.refresh: a sample that learning would reject as an outlier is accepted as
    a phase sample and *is* the profile; later job samples are judged against it alone; a pin
    still wins (real SQLite)."""
    from iadeep_cli.profiles import Profile
    from iadeep_cli.store import Store, profiles as profrows

    def p(util, solo=None):
        return Profile("train", util, 40.0, 10.0, "NVIDIA H200", solo_it_per_s=solo)

    store = Store(tmp_path / "iadeep.db")
    with store.tx() as conn:
        for job in range(1, 4):
            assert profrows.learn(conn, p(80, 100.0), job_id=job, owner="a", now=job)[0]
        assert profrows.learn(conn, p(30, 50.0), job_id=4, owner="a", now=4)[0] is None
        # one user's phase sample is held as theirs; another user's that agrees replaces it
        assert profrows.refresh(conn, p(30, 50.0), job_id=5, owner="b", now=5,
                                note="phase change: ...")[0] is None
        profile, verdict = profrows.refresh(conn, p(30, 50.0), job_id=6, owner="c", now=5,
                                            note="phase change: ...")
        source = "phase change of jobs 5 (b) and 6 (c)"
        assert profile == p(30, 50.0) and verdict == f"refreshed: {source}"
        [(now_in_effect, shown, _)] = profrows.load_profiles(conn)
        assert now_in_effect == p(30, 50.0) and shown == source
        kinds = [r["kind"] for r in conn.execute("SELECT kind FROM profile_samples ORDER BY id")]
        assert kinds == ["job"] * 4 + ["phase"] * 2
        # a job like the new phase is merged (against the phase sample, not the old 80s) ...
        merged, _ = profrows.learn(conn, p(34, 52.0), job_id=16, owner="a", now=6)
        assert merged is not None and merged.gpu_util == 32.0
        # ... and one like the old phase is now the outlier
        assert profrows.learn(conn, p(80, 100.0), job_id=7, owner="a", now=7)[0] is None
        profrows.set_pinned(conn, "train", "admin", 8)
        assert profrows.refresh(conn, p(90), job_id=8, owner="a", now=8, note="x") == \
            (None, "not refreshed: pinned by admin")
    store.close()


def test_one_users_phase_samples_stay_theirs_until_another_user_agrees_or_an_admin_adopts(
        tmp_path):
    """store/profiles.refresh: however many of one user's jobs report a phase, the lab's profile
    (every member's placement) stays; the samples are held as that user's (``held``); another
    user's disagreeing sample does not corroborate them, an agreeing one does; an admin's
    ``adopt`` does too (real SQLite)."""
    from iadeep_cli.profiles import Profile
    from iadeep_cli.store import Store, profiles as profrows

    def p(solo, util=80.0):
        return Profile("resnet50", util, 40.0, 10.0, "NVIDIA H200", solo_it_per_s=solo)

    store = Store(tmp_path / "iadeep.db")
    with store.tx() as conn:
        profrows.upsert_profile(conn, p(33.0), 0)
        for job in (1, 2, 3):   # one member, three jobs: still the lab's 33 it/s
            profile, verdict = profrows.refresh(conn, p(297.0), job_id=job, owner="mallory",
                                                now=job, note="phase change")
            assert profile is None and verdict.startswith("held as mallory's until ")
        [(lab, _, _)] = profrows.load_profiles(conn)
        assert lab.solo_it_per_s == 33.0
        assert profrows.held(conn) == {("mallory", "resnet50"): p(297.0)}
        # another user whose job disagrees (another rate) corroborates nothing
        assert profrows.refresh(conn, p(40.0), job_id=4, owner="bob", now=4, note="x")[0] is None
        assert profrows.load_profiles(conn)[0][0].solo_it_per_s == 33.0
        # an agreeing one (within the tolerance) does: the two's merge is the lab's
        profile, verdict = profrows.refresh(conn, p(45.0), job_id=5, owner="carol", now=5,
                                            note="x", rate_tolerance=0.25)
        assert profile is not None and profile.solo_it_per_s == 42.5
        assert verdict == "refreshed: phase change of jobs 4 (bob) and 5 (carol)"
        # what was held before that phase no longer counts
        assert profrows.held(conn) == {}
        # an admin adopts one user's held profile
        profrows.refresh(conn, p(297.0), job_id=6, owner="mallory", now=6, note="x")
        with pytest.raises(NotFoundError):
            profrows.adopt(conn, "resnet50", "bob", "admin", 7)
        profrows.adopt(conn, "resnet50", "mallory", "admin", 7)
        [(lab, source, _)] = profrows.load_profiles(conn)
        assert lab.solo_it_per_s == 297.0
        assert source == "phase change of job 6 (mallory), adopted by admin"
    store.close()


def test_a_sharing_estimate_against_the_labs_rate_is_not_a_start_for_values_alone(tmp_path):
    """``Adapter.phase_step``: a job of another batch size than the lab profiled for its label
    (50% busy and 50 it/s alone, where the profile says 20% and 100 it/s) starts beside a
    partner, so its speed is against the profile's 100 it/s (0.25 at half the GPU's time, not
    its own 0.5) and its utilisation alone is estimated at 25 / 0.25 = 100%. Once alone it
    shows its own, steady 50%: that is how it always ran, no phase change (as for the same job
    alone from the start). Were the skewed estimate its start, 50% would have moved from it and
    from the profile, and the profile would be refreshed with a phase it never changed."""
    from dataclasses import replace
    from types import SimpleNamespace

    from iadeep_cli.controller.round.steps.adaptation import Adapter
    from iadeep_cli.jobs import JobSpec, JobState
    from iadeep_cli.profiles import Profile
    from iadeep_cli.settings import Inventory, Policy
    from iadeep_cli.snapshot import GpuProcess, GpuSample
    from iadeep_cli.store import Store, jobrows

    lab_profile = Profile("w", gpu_util=20, mem_util=5, peak_mem_gib=1, gpu_model="G",
                          solo_it_per_s=100.0)
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as conn:
        ids = [jobrows.insert(conn, "alice", JobSpec("/bin/true", workload="w"), 0.0)[0]
               for _ in range(2)]
    with store.tx() as conn:
        jobs = [replace(jobrows.get(conn, i), state=JobState.RUNNING, node="n1",
                        gpu_indices=(0,)) for i in ids]
    me, partner = jobs
    observer = SimpleNamespace(alone_rates={}, progress_speeds={}, solo_rates={})
    observer.solo_rate = observer.solo_rates.get
    host = SimpleNamespace(store=store, observer=observer, refit=lambda: None, running=jobs,
                           inventory=Inventory(nodes=(), policy=Policy(adapt=FAST)))
    host.jobs = lambda states, node=None: [j for j in host.running if j.state in states]
    adapter = Adapter(host, observer, host.refit)
    profiles = {"w": lab_profile}

    def poll(t: float, processes, util: float) -> list:
        gpu = GpuSample(0, "u", "G", utilization_gpu=util, utilization_memory=5.0,
                        processes=tuple(processes))
        snapshot = SimpleNamespace(gpu=lambda node, index: gpu)
        return adapter.phase_step(t, snapshot, profiles, profiles)

    # sharing: half the GPU's time each; its speed against the lab's rate, 25 / 100
    observer.progress_speeds = {me.id: 0.25, partner.id: 0.5}
    sharing = [GpuProcess(1, 1024.0, job_id=me.id, sm_util=25.0),
               GpuProcess(2, 1024.0, job_id=partner.id, sm_util=10.0)]
    found = [c for t in range(0, 100, 10) for c in poll(float(t), sharing, 35.0)]
    assert found == []
    # its partner ended: alone, 50% busy at its own 50 it/s, as it always ran
    host.running = [me]
    observer.progress_speeds, observer.alone_rates = {me.id: 1.0}, {me.id: 50.0}
    observer.solo_rates[me.id] = 50.0
    alone = [GpuProcess(1, 1024.0, job_id=me.id, sm_util=50.0)]
    found = [c for t in range(100, 300, 10) for c in poll(float(t), alone, 50.0)]
    assert found == []
    # and beside a partner again, now against its own rate: 25 / 0.5, still 50%
    host.running = jobs
    observer.progress_speeds, observer.alone_rates = {me.id: 0.5, partner.id: 0.5}, {}
    found = [c for t in range(300, 500, 10) for c in poll(float(t), sharing, 35.0)]
    assert found == []
    # a real change while it shares is still found: 80% alone, 40% of the SMs at speed 0.5
    busier = [GpuProcess(1, 1024.0, job_id=me.id, sm_util=40.0), sharing[1]]
    found = [c for t in range(500, 700, 10) for c in poll(float(t), busier, 50.0)]
    assert [(c.job_id, c.sharing, c.new) for c in found] == [(me.id, True, {UTIL: 80.0})]

"""Learnt profiles: merged over many jobs, outliers rejected, pins respected, every sample kept
with its job, user and time (real SQLite; the rules in iadeep_cli/profiles.py)."""
from dataclasses import replace

from iadeep_cli import profiles
from iadeep_cli.controller.catalog import profile_views
from iadeep_cli.model.data import shipped_profiles
from iadeep_cli.profiles import Profile
from iadeep_cli.store import Store, profiles as profrows

GPU = "NVIDIA H200"
SHIPPED = shipped_profiles()["resnet50"]   # gpu_util 97.5, mem_util 52.7, peak 5.7 GiB


def _p(util, mem=40.0, peak=10.0, label="train", solo=None, gpu=GPU):
    return Profile(label, util, mem, peak, gpu, solo_it_per_s=solo)


def _learn(conn, sample, job, owner="alice", shipped=None):
    return profrows.learn(conn, sample, job_id=job, owner=owner, now=float(job),
                          shipped=shipped)


def _view(conn, label):
    return {p["workload"]: p for p in profile_views(conn)}[label]


# ------------------------------------------------------------------ the rules
def test_a_profile_is_the_median_of_its_window_and_the_largest_peak():
    samples = [_p(60, peak=8), _p(70, peak=12, solo=10.0), _p(65, peak=9), _p(90, peak=9)]
    merged = profiles.merged(samples)
    assert merged.gpu_util == 67.5 and merged.peak_mem_gib == 12
    assert merged.solo_it_per_s == 10.0        # the median of the samples that have one
    assert merged.power_w is None              # none has it
    many = [_p(10)] * 5 + [_p(50)] * profiles.WINDOW
    assert profiles.merged(many).gpu_util == 50   # only the last WINDOW samples count


def test_first_sample_fits_and_an_idle_one_is_far_from_busy_history():
    history = [_p(80), _p(84), _p(78), _p(82), _p(81)]
    assert profiles.outlier_reason(_p(3, mem=1, peak=1), []) is None
    reason = profiles.outlier_reason(_p(3, mem=1, peak=1), history)
    assert reason.startswith("gpu_util 3.0 is far from the median 81.0 of 5 earlier sample(s)")
    assert profiles.outlier_reason(_p(70), history) is None   # run-to-run noise (floor 20)


def test_tolerance_widens_with_the_samples_own_spread_and_checks_memory():
    spread = [_p(20), _p(80), _p(35), _p(65), _p(50)]   # a workload that varies a lot
    assert profiles.outlier_reason(_p(5), spread) is None
    assert profiles.outlier_reason(_p(50, peak=40.0), [_p(50, peak=10.0)] * 3) \
        .startswith("peak_mem_gib 40.0")
    assert profiles.outlier_reason(_p(50, peak=11.5), [_p(50, peak=10.0)] * 3) is None


# ------------------------------------------------------------------ in the database
def test_an_idle_job_named_like_a_shipped_workload_does_not_replace_it(tmp_path):
    """The reported attack: bob's idle `resnet50.sh` used to become the lab's resnet50."""
    store = Store(tmp_path / "s.db")
    with store.tx() as conn:
        profile, verdict = _learn(conn, _p(0.5, mem=0.1, peak=0.4, label="resnet50"), 7,
                                  owner="bob", shipped=SHIPPED)
        assert profile is None and verdict.startswith("rejected: outlier: gpu_util 0.5")
        view = _view(conn, "resnet50")
    assert view["source"].startswith("shipped") and view["gpu_util"] == SHIPPED.gpu_util
    seed, rejected = view["samples"][1], view["samples"][0]
    assert seed["accepted"] and seed["job"] is None and "shipped" in seed["note"]
    assert (rejected["job"], rejected["user"], rejected["at"], rejected["accepted"]) == \
        (7, "bob", 7.0, False)


def test_a_real_run_merges_with_the_shipped_profile_without_its_solo_rate(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as conn:
        profile, _ = _learn(conn, _p(90, mem=50, peak=6, label="resnet50", solo=20.0), 3,
                            shipped=SHIPPED)
    assert profile.gpu_util == (90 + SHIPPED.gpu_util) / 2
    assert profile.solo_it_per_s == 20.0   # the shipped program's own rate is not this lab's
    assert profile.peak_mem_gib == 6


def test_many_runs_outvote_nothing_and_one_odd_run_changes_nothing(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as conn:
        for job, util in enumerate((60, 62, 58, 61, 63), start=1):
            profile, verdict = _learn(conn, _p(util), job)
            assert profile is not None, verdict
        before = _view(conn, "train")
        assert before["gpu_util"] == 61 and before["source"] == \
            "median of 5 samples, last job 5 (alice)"
        assert _learn(conn, _p(1, mem=1, peak=0.5), 6, owner="bob")[0] is None
        after = _view(conn, "train")
    assert {k: after[k] for k in ("gpu_util", "source")} == \
        {k: before[k] for k in ("gpu_util", "source")}
    assert [(s["job"], s["user"], s["accepted"]) for s in after["samples"][:2]] == \
        [(6, "bob", False), (5, "alice", True)]


def test_a_profile_learnt_before_samples_were_kept_is_the_first_reference(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as conn:
        profrows.upsert_profile(conn, _p(70, solo=5.0), 1.0, source="job 1")
        assert _learn(conn, _p(5), 2)[0] is None
        assert _learn(conn, _p(74), 3)[0].gpu_util == 72


def test_a_pinned_profile_never_learns_until_unpinned(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as conn:
        _learn(conn, _p(60), 1)
        profrows.set_pinned(conn, "train", "pi", 2.0)
        profile, verdict = _learn(conn, _p(65), 3)
        assert profile is None and verdict == "rejected: pinned by pi"
        view = _view(conn, "train")
        assert view["gpu_util"] == 60 and (view["pinned_by"], view["pinned_at"]) == ("pi", 2.0)
        profrows.set_pinned(conn, "train", None, 4.0)
        assert _learn(conn, _p(66), 5)[0].gpu_util == 63
        assert _view(conn, "train")["pinned_by"] is None


def test_pinning_a_shipped_profile_pins_a_copy_without_its_solo_rate(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as conn:
        profrows.set_pinned(conn, "resnet50", "pi", 1.0, shipped=SHIPPED)
        [(stored, _source, _at)] = profrows.load_profiles(conn)
        assert stored == replace(SHIPPED, solo_it_per_s=None)
        assert _learn(conn, _p(95, label="resnet50"), 2, shipped=SHIPPED)[0] is None

"""Progress files and the online-learning helpers."""
from __future__ import annotations

import pytest

from iadeep_cli.errors import InputError
from iadeep_cli.model import observed_speed, profile_from_samples
from iadeep_cli.progress import parse_progress, rate, read_progress, report
from iadeep_cli.snapshot import GpuSample


def test_report_appends_and_read_back(tmp_path, monkeypatch):
    f = tmp_path / "progress"
    monkeypatch.setenv("IADEEP_PROGRESS_FILE", str(f))
    report(10)
    report(20)
    pts = read_progress(f)
    assert [i for _, i in pts] == [10, 20] and pts[0][0] <= pts[1][0]


def test_report_without_env_is_noop(tmp_path, monkeypatch):
    monkeypatch.delenv("IADEEP_PROGRESS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    report(5)
    assert list(tmp_path.iterdir()) == []


def test_partial_last_line_and_junk_ignored(tmp_path):
    f = tmp_path / "p"
    f.write_text("100.0 0\ngarbage\n110.0 50\n120.0 1")
    assert read_progress(f) == [(100.0, 0), (110.0, 50)]
    assert read_progress(tmp_path / "missing") == []


def test_rate_and_window():
    pts = [(0.0, 0), (10.0, 100), (20.0, 300)]
    assert rate(pts) == pytest.approx(15.0)
    assert rate(pts, window_s=10) == pytest.approx(20.0)
    assert rate(pts[:1]) is None


def test_observed_speed_and_profile_from_samples():
    assert observed_speed(50.0, 100.0) == pytest.approx(0.5)
    with pytest.raises(InputError):
        observed_speed(1.0, 0.0)
    s = [GpuSample(0, "u", "NVIDIA H200", utilization_gpu=u, utilization_memory=m,
                   power_draw_w=w, power_limit_w=700.0)
         for u, m, w in ((90, 40, 500), (70, None, 300))]
    p = profile_from_samples("w", "NVIDIA H200", s, peak_mem_gib=2.0, solo_it_per_s=10.0)
    assert (p.gpu_util, p.mem_util, p.power_w, p.power_limit_w) == (80, 40, 400, 700)
    with pytest.raises(InputError):
        profile_from_samples("w", "g", [GpuSample(0, "u", "g")], 1.0)


def test_train_script_runs_if_torch(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "train_pytorch", Path(__file__).resolve().parents[2] / "jobs" / "train_pytorch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    f = tmp_path / "prog"
    monkeypatch.setenv("IADEEP_PROGRESS_FILE", str(f))
    assert mod.main(["--steps", "20", "--batch-size", "8", "--report-every", "5"]) == 0
    assert [i for _, i in read_progress(f)] == [5, 10, 15, 20]


def test_a_progress_line_holds_only_a_64_bit_count_and_a_finite_time():
    huge = "1" + "0" * 4000   # the attack of issue 41: a 4,001-digit count
    text = (f"100.0 1\n101.0 {huge}\n102.0 {2**63}\n103.0 {2**63 - 1}\nnan 5\ninf 5\n"
            "1e400 5\n-1 5\n104.0 -5\n105.0 +5\n106.0 \u0661\u0662\n1e12 5\n110.0 20\n")
    assert parse_progress(text) == [(100.0, 1), (103.0, 2**63 - 1), (110.0, 20)]


def test_the_attack_lines_give_no_rate_and_raise_nothing():
    huge = "1" + "0" * 4000
    points = parse_progress(f"100.0 1\n101.0 {huge}\n")
    assert points == [(100.0, 1)] and rate(points) is None
    # points not from parse_progress: still no exception, and never an infinite rate
    assert rate([(0.0, 0), (1.0, int(huge))]) is None
    assert rate([(0.0, 0), (5e-324, 2**63 - 1)]) is None

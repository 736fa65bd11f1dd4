"""The simulator: event loop arithmetic, truth lookups, determinism, the CLI and its errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler.placement import job_memory_mib
from iadeep_cli.settings import Policy
from iadeep_cli.sim.engine import SimJob, _mem_mib, make_planner, simulate
from iadeep_cli.sim.run import SimSettings, run_sim
from iadeep_cli.sim.truth import TruthModel

PROFILES = shipped_profiles()
PAIRS = shipped_pairs()
TRUTH = TruthModel(PAIRS, shipped_triples())
IADEEP = [str(Path(sys.executable).parent / "iadeep")]


def cli(*args, cwd=None):
    return subprocess.run(IADEEP + list(args), capture_output=True, text=True, cwd=cwd,
                          timeout=240)


def _run(jobs, name, gpus=1):
    mem = {j.id: 0.0 for j in jobs}
    planner = make_planner(name, PROFILES, TRUTH, TRUTH, Policy(), mem, 0)
    return simulate(jobs, planner, TRUTH, gpus=gpus, profiles=PROFILES, name=name)


# --------------------------------------------------------------------------- event loop
def test_solo_job_takes_its_duration_and_fifo_queues_the_next():
    jobs = [SimJob(1, 0.0, "resnet50", 100.0), SimJob(2, 10.0, "resnet50", 50.0)]
    r = _run(jobs, "exclusive")
    assert r.jcts == pytest.approx((100.0, 140.0))      # job 2 waits 90 s, runs 50 s
    assert r.makespan_s == pytest.approx(150.0) and r.gpu_busy == pytest.approx(1.0)


def test_shared_jobs_run_at_measured_speeds():
    pair = next(p for p in PAIRS if set(p.jobs) == {"lstm", "ncf"})
    s = dict(zip(pair.jobs, pair.speeds))
    jobs = [SimJob(1, 0.0, "lstm", 100.0), SimJob(2, 0.0, "ncf", 100.0)]
    r = _run(jobs, "packing")        # one GPU, two jobs: they share from t=0
    fast, slow = sorted(s.values(), reverse=True)
    t1 = 100.0 / fast                       # the faster one finishes first
    t2 = t1 + (100.0 - slow * t1)           # the other then runs alone at 1.0
    assert sorted(r.jcts) == pytest.approx([t1, t2])
    assert r.shared_frac == 1.0


def test_truth_uses_measured_triples_and_composes_the_rest():
    tri = shipped_triples()[-1]          # vgg16, lstm, resnet50: measured once
    assert sum(set(t.jobs) == set(tri.jobs) for t in shipped_triples()) == 1
    assert TRUTH.speeds(list(tri.jobs)) == pytest.approx(tri.speeds)
    rev = list(reversed(tri.jobs))
    assert TRUTH.speeds(rev) == pytest.approx(tuple(reversed(tri.speeds)))
    # a set measured twice (lstm, vgg16, ncf) is the mean of both measurements
    twice = [t for t in shipped_triples() if set(t.jobs) == {"lstm", "vgg16", "ncf"}]
    assert len(twice) == 2
    mean = sum(dict(zip(t.jobs, t.speeds))["lstm"] for t in twice) / 2
    assert TRUTH.speeds(["lstm", "vgg16", "ncf"])[0] == pytest.approx(mean)
    # composition rule on measured pairs: within 0.03 for triples of busy jobs, worse (0.11)
    # when the launch-bound mlp is one of three (documented in truth.py)
    bare = TruthModel(PAIRS)
    for t in shipped_triples():
        tol = 0.12 if "mlp" in t.jobs else 0.03
        assert bare.speeds(list(t.jobs)) == pytest.approx(t.speeds, abs=tol)


# --------------------------------------------------------------------------- determinism, targets
def test_same_seed_same_result_other_seed_differs():
    a = run_sim(SimSettings(jobs=80, seed=3)).to_dict()
    b = run_sim(SimSettings(jobs=80, seed=3)).to_dict()
    c = run_sim(SimSettings(jobs=80, seed=4)).to_dict()
    assert a == b
    assert a["policies"]["iadeep"]["avg_jct_s"] != c["policies"]["iadeep"]["avg_jct_s"]


@pytest.mark.parametrize("seed", [0, 1])
def test_iadeep_beats_exclusive_and_packing_on_defaults(seed):
    r = run_sim(SimSettings(seed=seed))
    res = {x.name: x for x in r.results}
    assert res["iadeep"].avg_jct_s <= 0.8 * res["exclusive"].avg_jct_s
    assert res["iadeep"].avg_jct_s < res["packing"].avg_jct_s
    assert len(res["iadeep"].jcts) == 300


def test_iadeep_is_within_5_percent_of_its_oracle_over_seeds():
    """Predictions instead of the measured speeds cost little on average. One trace can swing
    either way (groups of three make single seeds noisy: seed 0 alone is +12%, seeds 0-9 on
    average -0.2%), so the claim is about the mean over four seeds."""
    ratios = []
    for seed in range(4):
        run = run_sim(SimSettings(seed=seed, policies=("iadeep", "oracle")))
        res = {x.name: x for x in run.results}
        ratios.append(res["iadeep"].avg_jct_s / res["oracle"].avg_jct_s)
    assert sum(ratios) / len(ratios) <= 1.05, ratios


# --------------------------------------------------------------------------- CLI
def test_cli_json_shape():
    out = cli("sim", "--json", "--jobs", "40", "--seed", "1")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data["policies"]) == {"exclusive", "packing", "random", "tiresias", "gandiva",
                                     "lucid", "iadeep", "oracle"}
    for row in data["policies"].values():
        assert {"avg_jct_s", "p95_jct_s", "makespan_s", "gpu_busy"} <= set(row)
        assert 0.0 <= row["gpu_busy"] <= 1.0 and row["jobs"] == 40
    assert data["settings"]["jobs"] == 40 and data["settings"]["seed"] == 1


def test_table_ends_with_the_verdict_from_the_same_numbers():
    data = json.loads(cli("sim", "--json", "--jobs", "40", "--seed", "1").stdout)["policies"]
    text = cli("sim", "--jobs", "40", "--seed", "1").stdout
    ratio = data["iadeep"]["avg_jct_s"] / data["exclusive"]["avg_jct_s"]
    vs_oracle = data["iadeep"]["avg_jct_s"] / data["oracle"]["avg_jct_s"] - 1
    verdict = text.strip().splitlines()[-1]
    assert verdict.startswith("iadeep's average JCT: ")
    assert f"{ratio:.2f}x exclusive" in verdict and f"{vs_oracle:+.1%} vs oracle" in verdict
    assert verdict.endswith("vs oracle (iadeep's rule with the measured speeds instead of "
                            "predictions)")         # a reader learns what the oracle is


def test_cli_table_and_trace(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,workload,duration_s,gpus\n0,resnet50,600,1\n5,mlp,300,1\n"
                     "9,vgg16,900,2\n")
    out = cli("sim", "--trace", str(trace), "--policies", "exclusive,iadeep")
    assert out.returncode == 0, out.stderr
    assert "exclusive" in out.stdout and "iadeep" in out.stdout and "packing" not in out.stdout


def _one_line_error(out, *words):
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    first = out.stderr.strip().splitlines()[0]
    assert first.startswith("Error:")
    for w in words:
        assert w in out.stderr


def test_cli_unknown_workload_in_trace(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,workload,duration_s\n0,resnet50,60\n1,bert-huge,60\n")
    _one_line_error(cli("sim", "--trace", str(trace)), "bert-huge", ":3")


def test_cli_bad_numbers_in_trace(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,workload,duration_s\n0,resnet50,soon\n")
    _one_line_error(cli("sim", "--trace", str(trace)), "duration_s")


def test_cli_negative_jobs():
    _one_line_error(cli("sim", "--jobs", "-5"), "--jobs")


def test_cli_missing_files(tmp_path):
    _one_line_error(cli("sim", "--trace", str(tmp_path / "nope.csv")), "nope.csv")
    _one_line_error(cli("sim", "--truth", str(tmp_path / "pairs.csv")), "pairs.csv")


def test_cli_truth_missing_a_pair(tmp_path):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("gpu_model,job_a,job_b,speed_a,speed_b,samples\n"
                     "NVIDIA H200,mlp,mlp,0.9,0.9,1\n")
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,workload,duration_s\n0,mlp,60\n1,lstm,60\n")
    _one_line_error(cli("sim", "--truth", str(pairs), "--trace", str(trace)), "lstm")


def test_cli_unknown_policy():
    _one_line_error(cli("sim", "--policies", "exclusive,magic"), "magic")


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "jct.png"
    out = cli("sim", "--jobs", "30", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_simulator_counts_memory_by_the_placers_rule():
    """What a simulated job holds on its GPU is what the placer expects of it: profile peak
    plus margin, and for a workload without a profile nothing (the placer does not know its
    need, and counts nothing for it on the GPU it runs on), not the margin alone."""
    policy = Policy(memory_margin_gib=3.0)
    for workload in PROFILES:
        placed = Job(1, "sim", JobSpec("sim", workload=workload), JobState.QUEUED, 0.0)
        assert _mem_mib(SimJob(1, 0.0, workload, 60.0), PROFILES, policy) == \
            job_memory_mib(placed, PROFILES, policy)
    assert job_memory_mib(Job(1, "sim", JobSpec("sim", workload="unprofiled"),
                              JobState.QUEUED, 0.0), PROFILES, policy) is None
    assert _mem_mib(SimJob(1, 0.0, "unprofiled", 60.0), PROFILES, policy) == 0.0

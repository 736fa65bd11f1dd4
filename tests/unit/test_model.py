"""Interference model: loaders, fit/predict/eval on the shipped H200 data, CLI behaviour."""
from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from iadeep_cli.errors import InputError, ModelError
from iadeep_cli.model.data import (
    load_pairs_csv,
    load_profiles_csv,
    shipped_pairs,
    shipped_profiles,
    shipped_triples,
)
from iadeep_cli.model.evaluate import lowo_evaluate, triple_composition_error
from iadeep_cli.model.predictor import InterferenceModel, analytic_model, default_model, fit_model

ROOT = Path(__file__).resolve().parents[2]
IADEEP = str(Path(sys.executable).with_name("iadeep"))
SHARED = ROOT / "iadeep_cli" / "data" / "h200"
GPM = ("sm_util", "sm_occupancy", "tensor_util", "fp32_util", "fp16_util")


def cli(*args, cwd=None):
    return subprocess.run([IADEEP, "model", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


def strip_gpm(profiles):
    return {k: dataclasses.replace(p, **dict.fromkeys(GPM)) for k, p in profiles.items()}


# -- loaders ---------------------------------------------------------------------------------
def test_shipped_data_matches_files():
    profs, pairs = shipped_profiles(), shipped_pairs()
    with open(SHARED / "profiles.csv") as f:
        rows = list(csv.DictReader(f))
    assert set(profs) == {r["workload"] for r in rows}
    for r in rows:
        assert profs[r["workload"]].gpu_util == float(r["gpu_util"])
    assert len(pairs) == len((SHARED / "pairs.csv").read_text().splitlines()) - 1
    assert all(len(t.jobs) == 3 for t in shipped_triples())
    assert load_pairs_csv(SHARED / "pairs.csv") == pairs


def test_optional_columns_may_be_missing_or_empty(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text("workload,gpu_util,mem_util,peak_mem_gib,power_w\na,50,10,1.0,\nb,90,40,2,300\n")
    profs = load_profiles_csv(f)
    assert profs["a"].power_w is None and profs["b"].power_w == 300.0
    assert profs["a"].sm_util is None


# -- fit / predict -----------------------------------------------------------------------------
def test_lowo_beats_both_baselines_and_is_accurate():
    res = lowo_evaluate(shipped_profiles(), shipped_pairs())
    # 21 mixed pairs are held out once per member, 7 self-pairs once; two speeds each
    assert res.n_predictions == 2 * (21 * 2 + 7)
    assert res.mae_model <= 0.06
    assert res.mae_model < res.mae_mean_baseline
    assert res.mae_model < res.mae_util_sum_baseline


def test_lowo_without_gpm_columns_still_works():
    res = lowo_evaluate(strip_gpm(shipped_profiles()), shipped_pairs())
    assert res.mae_model <= 0.06 and res.mae_model < res.mae_util_sum_baseline


def test_swap_consistency_and_sanity_bounds():
    m, profs = default_model(), list(shipped_profiles().values())
    for a in profs:
        for b in profs:
            p, q = m.predict_pair(a, b), m.predict_pair(b, a)
            assert (p.speed_a, p.speed_b) == (q.speed_b, q.speed_a)
            assert 0 < p.speed_a <= 1.05 and 0 < p.speed_b <= 1.05
            assert 0 <= p.confidence <= 1
            # every shipped pair is measured, so the measurement weighs in
            assert p.method == "observed"
    many = m.predict_many([(a, b) for a in profs for b in profs])
    assert many.shape == (49, 2)


def test_unseen_workload_predicted_from_profile_alone():
    profs, pairs = shipped_profiles(), shipped_pairs()
    m = fit_model(profs, [o for o in pairs if "vgg16" not in o.jobs])
    assert "vgg16" not in m.trained_on
    held = [o for o in pairs if "vgg16" in o.jobs]
    pred = m.predict_many([(profs[o.jobs[0]], profs[o.jobs[1]]) for o in held])
    truth = np.array([o.speeds for o in held])
    assert np.abs(pred - truth).mean() < 0.06


def test_new_workload_with_made_up_profile_is_sane():
    profs = shipped_profiles()
    new = dataclasses.replace(profs["resnet50"], workload="new", gpu_util=60.0, power_w=None,
                              sm_util=None, sm_occupancy=None, tensor_util=None)
    m = default_model()
    for p in profs.values():
        r = m.predict_pair(new, p)
        assert 0 < r.speed_a <= 1.05 and 0 < r.speed_b <= 1.05


def test_too_little_data_falls_back_to_analytic_and_says_so():
    profs, pairs = shipped_profiles(), shipped_pairs()
    m = fit_model(profs, pairs[:2])
    assert m.is_analytic and "analytic" in m.note
    p = m.predict_pair(profs["vgg16"], profs["vgg16"])
    assert p.method == "analytic"
    assert p == analytic_model().predict_pair(profs["vgg16"], profs["vgg16"])
    # conservative: two saturated jobs are predicted to lose more than half their speed
    assert p.speed_a < 0.5


def test_extra_observations_override_shipped_ones():
    profs, pairs = shipped_profiles(), shipped_pairs()
    lab = [dataclasses.replace(o, speeds=(0.2, 0.2)) for o in pairs if o.jobs == ("mlp", "mlp")]
    base = fit_model(profs, pairs).predict_pair(profs["mlp"], profs["mlp"]).speed_a
    over = fit_model(profs, pairs, extra_observations=lab).predict_pair(
        profs["mlp"], profs["mlp"]).speed_a
    assert over < base - 0.1


def test_group_rule_and_triples():
    m, profs = default_model(), shipped_profiles()
    assert m.predict_group([profs["mlp"]]) == (1.0,)
    pair = m.predict_pair(profs["lstm"], profs["ncf"])
    assert m.predict_group([profs["lstm"], profs["ncf"]]) == pytest.approx(
        (pair.speed_a, pair.speed_b))
    err = triple_composition_error(m, profs, shipped_triples())
    mean_err = np.mean([abs(s - np.mean([x for t in shipped_triples() for x in t.speeds]))
                        for t in shipped_triples() for s in t.speeds])
    assert err < mean_err


def test_save_load_roundtrip_and_other_version(tmp_path):
    m, profs = default_model(), shipped_profiles()
    f = tmp_path / "m.json"
    m.save(f)
    back = InterferenceModel.load(f)
    a, b = profs["mlp"], profs["resnet18"]
    assert back.predict_pair(a, b) == pytest.approx(m.predict_pair(a, b))
    data = json.loads(f.read_text())
    data["version"] = 999
    f.write_text(json.dumps(data))
    with pytest.raises(ModelError, match="version"):
        InterferenceModel.load(f)


# -- CLI ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("m") / "model.json"
    r = cli("fit", "-o", f)
    assert r.returncode == 0, r.stderr
    return f


def test_cli_predict_order_and_header(tmp_path, model_file):
    q = tmp_path / "q.csv"
    q.write_text("job_a,job_b,extra\nvgg16,mlp,x\nmlp,vgg16,y\nncf,ncf,z\n")
    r = cli("predict", "--model", model_file, "--pairs", q)
    assert r.returncode == 0, r.stderr
    rows = list(csv.reader(r.stdout.splitlines()))
    assert rows[0] == ["job_a", "job_b", "speed_a", "speed_b"]
    assert [row[:2] for row in rows[1:]] == [["vgg16", "mlp"], ["mlp", "vgg16"], ["ncf", "ncf"]]
    assert rows[1][2:] == rows[2][:1:-1]
    profs = shipped_profiles()
    want = InterferenceModel.load(model_file).predict_pair(profs["vgg16"], profs["mlp"])
    assert float(rows[1][2]) == pytest.approx(want.speed_a, abs=1e-4)


def test_cli_eval_json_and_table():
    r = cli("eval", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)["results"]
    assert [d["protocol"] for d in data] == ["leave-one-workload-out"]  # no families in H200
    assert data[0]["mae_model"] < data[0]["mae_util_sum_baseline"]
    assert 0 < data[0]["coverage"] <= 1
    assert data[0]["fit_s"] > 0
    t = cli("eval")
    for needle in ("constant (training mean)", "analytic prior", "utilisation sum", "cover",
                   "s per fold"):
        assert needle in t.stdout


def test_cli_eval_without_gpm_columns(tmp_path):
    src = list(csv.DictReader((SHARED / "profiles.csv").read_text().splitlines()))
    cols = [c for c in src[0] if c not in GPM]
    f = tmp_path / "p.csv"
    with open(f, "w", newline="") as fh:
        w = csv.DictWriter(fh, cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(src)
    r = cli("eval", "--profiles", f, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["mae_model"] <= 0.06


@pytest.mark.parametrize("content,needle", [
    ("", "empty file"),
    ("workload,gpu_util,peak_mem_gib\nx,1,1\n", "missing column(s) mem_util"),
    ("workload,gpu_util,mem_util,peak_mem_gib\nx,1,1,1\ny,abc,1,1\n", "line 3, column gpu_util"),
])
def test_cli_malformed_profiles_one_line_error(tmp_path, content, needle):
    f = tmp_path / "bad.csv"
    f.write_text(content)
    r = cli("eval", "--profiles", f)
    assert r.returncode == 1
    first = r.stderr.splitlines()[0]
    assert first.startswith("Error: ") and str(f) in first and needle in first
    assert "Traceback" not in r.stderr


def test_cli_malformed_pairs_and_unknown_workload(tmp_path, model_file):
    bad = tmp_path / "pairs.csv"
    bad.write_text("job_a,job_b,speed_a,speed_b\nmlp,mlp,0.9,oops\n")
    r = cli("fit", "--pairs", bad, "-o", tmp_path / "m.json")
    assert r.returncode == 1 and "line 2, column speed_b" in r.stderr and str(bad) in r.stderr
    q = tmp_path / "q.csv"
    q.write_text("job_a,job_b\nmlp,mlp\nmlp,nosuch\n")
    r = cli("predict", "--model", model_file, "--pairs", q)
    assert r.returncode == 1 and "line 3, column job_b" in r.stderr and "nosuch" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_bad_model_file(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"format": "iadeep-interference-model", "version": 0, "gps": []}))
    q = tmp_path / "q.csv"
    q.write_text("job_a,job_b\nmlp,mlp\n")
    r = cli("predict", "--model", f, "--pairs", q)
    assert r.returncode == 1 and "version" in r.stderr and "Traceback" not in r.stderr


def test_a_model_file_with_partner_offsets_is_refused_an_empty_key_ignored(tmp_path):
    """An earlier iadeep could store each workload's offset as the partner (an option, off by
    default, since removed). A file whose key is empty loads and predicts as one without it;
    one that carries such offsets would predict otherwise here: a one-line error that says to
    refit."""
    m, profs = default_model(), shipped_profiles()
    a, b = profs["mlp"], profs["resnet18"]
    f = tmp_path / "m.json"
    m.save(f)
    data = json.loads(f.read_text())
    assert "partner_offsets" not in data
    f.write_text(json.dumps({**data, "partner_offsets": {}}))
    assert InterferenceModel.load(f).predict_pair(a, b) == m.predict_pair(a, b)
    f.write_text(json.dumps({**data, "partner_offsets": {"resnet18": -0.1}}))
    with pytest.raises(ModelError, match="partner offsets") as exc:
        InterferenceModel.load(f)
    assert "iadeep model fit" in (exc.value.hint or "")
    q = tmp_path / "q.csv"
    q.write_text("job_a,job_b\nmlp,resnet18\n")
    r = cli("predict", "--model", f, "--pairs", q)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("Error: ") and str(f) in first and "partner offsets" in first
    assert "iadeep model fit" in r.stderr


def test_predict_path_does_not_import_sklearn(tmp_path, model_file):
    q = tmp_path / "q.csv"
    q.write_text("job_a,job_b\nmlp,mlp\n")
    code = ("import sys; from iadeep_cli.cli.main import app;"
            f"sys.argv=['iadeep','model','predict','--model',{str(model_file)!r},"
            f"'--pairs',{str(q)!r}];\n"
            "try:\n app()\nexcept SystemExit: pass\n"
            "print('SKLEARN' if {'sklearn', 'scipy'} & set(sys.modules) else 'NOSKLEARN')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip().endswith("NOSKLEARN"), r.stdout + r.stderr


# -- generalisation, intervals, the lab's own observations (issue 17) --------------------------
LUCID = ROOT.parent.parent / "shared" / "data" / "lucid-part"
if not LUCID.is_dir():
    LUCID = Path("/work/shared/data/lucid-part")
needs_lucid = pytest.mark.skipif(not (LUCID / "pairs.csv").is_file(),
                                 reason="lucid-part data not available")


@needs_lucid
def test_leave_one_family_out_on_another_gpu_beats_constant_and_covers():
    from iadeep_cli.model.data import load_families_csv
    from iadeep_cli.model.evaluate import LOFO, cross_validate

    profs = load_profiles_csv(LUCID / "profiles.csv")
    pairs = load_pairs_csv(LUCID / "pairs.csv")
    fams = load_families_csv(LUCID / "profiles.csv")
    assert len(set(fams.values())) == 5
    res = cross_validate(profs, pairs, fams, protocol=LOFO, level=0.8)
    assert res.n_groups == 5
    assert res.mae_model < 0.85 * res.mae_mean_baseline       # clearly below the constant
    assert res.mae_model < res.mae_analytic_prior
    # clearly below the utilisation-sum rule (level with it, 0.0752 / 0.0753, before a known
    # workload's own offset carried to the partners it was not measured with)
    assert res.mae_model < 0.95 * res.mae_util_sum_baseline
    assert 0.7 <= res.coverage <= 0.9                          # 80 % intervals cover ~80 %


def test_eval_selects_each_fold_setting_on_the_protocols_own_unit(monkeypatch):
    """The nested selection holds out what the protocol holds out: single workloads inside a
    leave-one-workload-out fold, families inside a leave-one-family-out fold (families chosen
    on held-out workloads overrate what siblings teach; the reverse ignores them)."""
    from iadeep_cli.model import evaluate
    from iadeep_cli.model.evaluate import LOFO, cross_validate

    seen = []

    def recording_fit(p, o, *args, **kw):
        seen.append(kw.get("groups"))
        return fit_model(p, o, *args, **kw)

    monkeypatch.setattr(evaluate, "fit_model", recording_fit)
    profs, pairs = shipped_profiles(), shipped_pairs()
    lowo_evaluate(profs, pairs)
    assert seen and all(g == {w: w for w in profs} for g in seen)
    fams = {"resnet18": "cnn", "resnet50": "cnn", "vgg16": "cnn", "lstm": "seq",
            "transformer": "seq", "mlp": "mlp", "ncf": "ncf"}
    seen.clear()
    res = cross_validate(profs, pairs, fams, protocol=LOFO)
    assert res.n_groups == 4
    assert seen and all(g == fams for g in seen)


def test_lowo_interval_coverage_on_h200():
    res = lowo_evaluate(shipped_profiles(), shipped_pairs(), level=0.8)
    assert 0.65 <= res.coverage <= 0.95
    wide = lowo_evaluate(shipped_profiles(), shipped_pairs(), level=0.95)
    assert wide.coverage >= res.coverage and wide.mean_interval_width > res.mean_interval_width


def test_fitted_prior_is_monotonic_in_the_partner():
    from iadeep_cli.model.fit import _directed_rows, _fit_prior
    from iadeep_cli.model.terms import PriorForm, PriorKind, prior_speed, prior_terms
    profs = {f"w{i}": dataclasses.replace(p, workload=f"w{i}", gpu_util=u, mem_util=m)
             for i, (p, u, m) in enumerate(
                 (next(iter(shipped_profiles().values())), u, m)
                 for u in (10, 40, 70, 95) for m in (5, 40))}
    rng = np.random.default_rng(0)
    obs = [dataclasses.replace(shipped_pairs()[0], jobs=(a, b), speeds=tuple(
        rng.uniform(0.4, 1.05, 2))) for a in profs for b in profs if a <= b]
    # noise: any fit must stay monotonic
    theta = _fit_prior(_directed_rows(profs, obs), PriorForm(PriorKind.RIDGE, 0.03))
    me = profs["w0"]
    for m in (0.0, 50.0, 100.0):
        speeds = [float(prior_speed(theta, prior_terms(me, dataclasses.replace(
            me, gpu_util=u, mem_util=m)))) for u in range(0, 101, 5)]
        assert all(x >= y - 1e-12 for x, y in itertools.pairwise(speeds))


def _lab_pair_case():
    """A lab workload (a copy of resnet18's profile under a new name) whose true speed next to
    vgg16 is 0.3 below what the shipped model predicts for it."""
    profs = shipped_profiles()
    lab = dataclasses.replace(profs["resnet18"], workload="labnet")
    base = fit_model(profs, shipped_pairs(), extra_profiles={"labnet": lab})
    prior = base.predict_pair(lab, profs["vgg16"])
    truth = (prior.speed_a - 0.3, prior.speed_b)
    return profs, lab, base, truth


@pytest.mark.parametrize("noise", [0.0, 0.02])
def test_lab_observations_win_after_two(noise):
    """A pair the model gets wrong by 0.3 is within 0.03 after N = 2 observations with
    measurement noise of std 0.02 (after one without noise): the N of docs/scheduling.md."""
    profs, lab, _base, truth = _lab_pair_case()
    rng = np.random.default_rng(1)
    errors, widths = [], []
    for n in range(4):
        obs = [dataclasses.replace(shipped_pairs()[0], jobs=("labnet", "vgg16"), samples=1,
                                   speeds=tuple(np.clip(np.array(truth) + rng.normal(0, noise, 2),
                                                        0.05, 1.05))) for _ in range(n)]
        m = fit_model(profs, shipped_pairs(), extra_profiles={"labnet": lab},
                      extra_observations=obs)
        p = m.predict_pair(lab, profs["vgg16"])
        errors.append(abs(p.speed_a - truth[0]))
        (lo, _), (hi, _) = m.predict_interval(lab, profs["vgg16"], 0.8)
        widths.append(hi - lo)
    assert errors[0] > 0.25
    assert errors[1] < (0.01 if noise == 0 else 0.05)
    assert errors[2] < 0.03 and errors[3] < 0.03
    assert widths[0] > widths[1] > widths[2] > widths[3]
    assert m.predict_pair(lab, profs["vgg16"]).method == "observed"


def test_interval_roundtrip_and_level_checks(tmp_path):
    m, profs = default_model(), shipped_profiles()
    f = tmp_path / "m.json"
    m.save(f)
    back = InterferenceModel.load(f)
    a, b = profs["mlp"], profs["lstm"]
    assert np.allclose(back.predict_interval(a, b, 0.8), m.predict_interval(a, b, 0.8))
    (lo_a, lo_b), (hi_a, hi_b) = m.predict_interval(a, b, 0.8)
    p = m.predict_pair(a, b)
    assert lo_a <= p.speed_a <= hi_a and lo_b <= p.speed_b <= hi_b
    from iadeep_cli.errors import InputError
    with pytest.raises(InputError):
        m.predict_interval(a, b, 1.5)
    fallback = analytic_model()
    (flo, _), (fhi, _) = fallback.predict_interval(a, b, 0.8)
    assert fhi - flo > hi_a - lo_a          # no data: a wider interval


def test_families_from_column_or_name(tmp_path):
    from iadeep_cli.model.data import family_of, load_families_csv
    assert family_of("ResNet18-CIFAR-10-bs32-amp0") == "ResNet18" and family_of("mlp") == "mlp"
    f = tmp_path / "p.csv"
    f.write_text("workload,family,gpu_util,mem_util,peak_mem_gib\n"
                 "a-1,,50,10,1\nb,conv,60,20,2\n")
    assert load_families_csv(f) == {"a-1": "a", "b": "conv"}


# -- scaling, the simple rules, intervals that widen ---------------------------------------------
def _synthetic_lab(n_workloads, n_pairs, repeats=1, seed=0):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_fit import synthetic_lab
    return synthetic_lab(n_workloads, max(3, n_workloads // 5), n_pairs, n_pairs * repeats, seed)


def test_repeated_measurements_are_aggregated_per_pair():
    from iadeep_cli.model.fit import _directed_rows
    profs, obs = _synthetic_lab(12, 40, repeats=5)
    rows = _directed_rows(profs, obs)
    assert len(rows) == len({(o.jobs[0], o.jobs[1]) for o in obs} |
                            {(o.jobs[1], o.jobs[0]) for o in obs})
    assert sum(r.n for r in rows) == 2 * len(obs)
    key = obs[0].jobs
    mine = [o.speeds[0] for o in obs if o.jobs == key]
    row = next(r for r in rows if (r.s.workload, r.o.workload) == key)
    if key[0] != key[1]:
        assert row.y == pytest.approx(np.mean(mine))


def test_correction_keeps_a_bounded_number_of_points():
    from iadeep_cli.model.terms import MAX_INDUCING
    profs, obs = _synthetic_lab(30, 300)
    m = fit_model(profs, obs)
    assert m.gps and all(len(g.x_train) <= MAX_INDUCING for g in m.gps)
    # the JSON stays small: no n x n matrix of every measured pair
    assert len(json.dumps(m.to_dict())) < 2_000_000


def test_prior_leans_on_the_rule_that_does_better_alone():
    """Data made by the utilisation-sum rule: the prior is fitted toward it, not the analytic
    one, and predicts an unseen family about as well as the rule itself."""
    profs, obs = _synthetic_lab(25, 240)
    truth = {o.jobs: o for o in obs}
    obs = [dataclasses.replace(o, speeds=tuple(
        1.0 / max(1.0, (profs[o.jobs[0]].gpu_util + profs[o.jobs[1]].gpu_util) / 100.0)
        for _ in range(2))) for o in truth.values()]
    m = fit_model(profs, obs)
    assert "utilisation sum" in m.note


def test_interval_widens_far_from_measured_pairs():
    m, profs = default_model(), shipped_profiles()
    near = dataclasses.replace(profs["resnet50"], workload="near")
    far = dataclasses.replace(profs["resnet50"], workload="far", gpu_util=30.0, power_w=700.0,
                              sm_util=95.0, sm_occupancy=90.0, tensor_util=90.0)
    other = profs["lstm"]
    width = {}
    for p in (near, far):
        (lo, _), (hi, _) = m.predict_interval(p, other, 0.8)
        width[p.workload] = hi - lo
    assert m.predict_pair(far, other).confidence < m.predict_pair(near, other).confidence
    assert width["far"] > 1.2 * width["near"]


# -- a known workload's own offset ------------------------------------------------------------
def test_a_known_workloads_own_offset_carries_to_new_partners():
    """A workload that runs 0.1 faster than its utilisation says next to every partner (as
    Lucid's VGG does): measured next to some partners, its speed next to a partner it was
    never measured with keeps that offset; a new workload with the same profile does not."""
    profs, obs = _synthetic_lab(25, 300)
    odd = "fam0-v0"
    obs = [dataclasses.replace(o, speeds=tuple(min(1.1, s + 0.1) if j == odd else s
                                               for j, s in zip(o.jobs, o.speeds)))
           for o in obs]
    partners = sorted({j for o in obs if odd in o.jobs for j in o.jobs if j != odd})
    held = set(partners[:3])
    train = [o for o in obs if not (odd in o.jobs and held & set(o.jobs))]
    m = fit_model(profs, train)
    assert m.offsets.get(odd, 0.0) > 0.05
    clone = dataclasses.replace(profs[odd], workload="new-clone")
    errs, clone_gap = [], []
    for o in obs:
        if odd in o.jobs and held & set(o.jobs):
            i = o.jobs.index(odd)
            other = profs[o.jobs[1 - i]]
            errs.append(abs(m.predict_pair(profs[odd], other).speed_a - o.speeds[i]))
            clone_gap.append(m.predict_pair(profs[odd], other).speed_a
                             - m.predict_pair(clone, other).speed_a)
    assert errs and float(np.mean(errs)) < 0.05
    assert float(np.mean(clone_gap)) > 0.05      # the offset belongs to the workload, by name


def test_offsets_roundtrip_and_a_file_without_them_loads(tmp_path):
    profs, obs = _synthetic_lab(25, 240)
    m = fit_model(profs, obs)
    assert m.offsets
    f = tmp_path / "m.json"
    m.save(f)
    back = InterferenceModel.load(f)
    a, b = profs["fam1-v0"], profs["fam2-v1"]
    assert back.offsets == m.offsets
    assert back.predict_pair(a, b) == m.predict_pair(a, b)
    data = json.loads(f.read_text())
    del data["offsets"]                     # written before offsets existed
    old = InterferenceModel.from_dict(data)
    assert old.offsets == {}
    want = m._structural(a, b)[0] - [m.offsets.get(a.workload, 0.0),
                                     m.offsets.get(b.workload, 0.0)]
    assert old._structural(a, b)[0] == pytest.approx(want)


def test_too_few_workloads_for_offsets():
    """Seven H200 workloads are too few to tell the spread between workloads from noise."""
    assert default_model().offsets == {}


# -- incremental refit -----------------------------------------------------------------------
def test_refit_after_a_few_observations_reuses_the_selection(monkeypatch):
    """A few new observations: the previous fit's setting and calibration are reused (no
    inner cross-validation) and the structure is refitted on all the data; after 10 % more
    distinct rows the setting is selected afresh."""
    from iadeep_cli.model import fit

    profs, obs = _synthetic_lab(25, 240)
    first = fit.fit_parameters(profs, obs[:200])
    assert first["selection"]["rows"] > 0
    calls = []
    real = fit._inner_cv
    monkeypatch.setattr(fit, "_inner_cv", lambda *a: calls.append(1) or real(*a))
    few = fit.fit_parameters(profs, obs[:203], previous=first)
    assert not calls
    assert few["calibration"] == first["calibration"]
    assert few["selection"] == first["selection"]
    assert "selected on" in few["note"]
    assert [list(o[:2]) for o in few["observed"]].count(list(obs[201].jobs)) == 1
    many = fit.fit_parameters(profs, obs[:240], previous=first)
    assert calls and many["selection"]["rows"] > first["selection"]["rows"]
    # another GPU's or an unreadable previous model: a full fit
    calls.clear()
    fit.fit_parameters(profs, obs[:203], previous={**first, "gpu_model": "other"})
    fit.fit_parameters(profs, obs[:203], previous={"selection": {"base": 1}})
    assert len(calls) == 2


# -- the offsets' share and the nested choice among variants ----------------------------------
def _odd_lab():
    """25 synthetic workloads, one of which runs 0.1 faster than its utilisation says."""
    profs, obs = _synthetic_lab(25, 300)
    return profs, [dataclasses.replace(o, speeds=tuple(min(1.1, s + 0.1) if j == "fam0-v0"
                                                       else s for j, s in zip(o.jobs, o.speeds)))
                   for o in obs]


def test_the_offsets_share_is_a_setting_of_the_inner_cv():
    """``offset_scales``: the shares of the workloads' own offsets the inner cross-validation
    chooses among; (0,) is the model without offsets, and a previous fit's share outside the
    candidates is not reused."""
    from iadeep_cli.model import fit

    profs, obs = _odd_lab()
    none = fit.fit_parameters(profs, obs, offset_scales=(0.0,))
    assert none["offsets"] == {} and none["selection"]["offset_scale"] == 0.0
    chosen = fit.fit_parameters(profs, obs, offset_scales=(0.0, 1.0))
    assert chosen["selection"]["offset_scale"] == 1.0      # the odd workload's offset is real
    assert chosen["offsets"]["fam0-v0"] > 0.05
    assert fit.fit_parameters(profs, obs, offset_scales=(0.5,))["offsets"]["fam0-v0"] \
        == pytest.approx(0.5 * chosen["offsets"]["fam0-v0"])
    assert fit._reusable(none, none["gpu_model"], 600, 25, (1.0,)) is None
    assert fit._reusable(none, none["gpu_model"], 600, 25, (1.0, 0.0)) is not None
    with pytest.raises(InputError):
        fit.fit_parameters(profs, obs, offset_scales=(2.0,))


def test_nested_choice_is_made_on_inner_held_out_data_only():
    """Each outer fold chooses its variant by the protocol run on its own training pairs: a
    variant that memorises its training pairs (perfect on them, blind elsewhere) loses every
    inner choice, and no fit ever sees the outer fold's held-out workload."""
    from iadeep_cli.model.evaluate import LOWO, nested_cross_validate
    from iadeep_cli.model.predictor import PairPrediction

    profs, pairs = shipped_profiles(), shipped_pairs()
    seen: list[set[str]] = []

    class Memo:
        def __init__(self, obs):
            self.known = {o.jobs: o.speeds for o in obs}

        def predict_pair(self, a, b):
            s = self.known.get((a.workload, b.workload)) or \
                self.known.get((b.workload, a.workload), (0.5, 0.5))[::-1]
            return PairPrediction(s[0], s[1], 1.0, "observed")

        def predict_interval(self, a, b, level):
            return (0.0, 0.0), (1.05, 1.05)

    def spy(make):
        def variant(groups):
            def fit(p, o):
                seen.append({j for x in o for j in x.jobs})
                return make(p, o, groups)
            return fit
        return variant

    variants = {"memo": spy(lambda p, o, g: Memo(o)),
                "model": spy(lambda p, o, g: fit_model(p, o, groups=g))}
    res = nested_cross_validate(profs, pairs, {}, variants, protocol=LOWO)
    assert set(res.chosen) == set(profs) and set(res.chosen.values()) == {"model"}
    for scores in res.inner_mae.values():
        assert scores["memo"] > scores["model"]
    assert seen and max(len(s) for s in seen) == len(profs) - 1   # never all seven
    assert sum(len(s) == len(profs) - 1 for s in seen) == len(profs)  # one outer fit a fold
    single = nested_cross_validate(profs, pairs, {}, {"model": variants["model"]},
                                   protocol=LOWO)
    assert single.outer.mae_model == pytest.approx(lowo_evaluate(profs, pairs).mae_model)


# -- the base rule times one fitted factor -----------------------------------------------------
def test_a_scaled_rule_is_fitted_with_few_workloads():
    """Data made by the analytic rule with a steeper partner term (1.6 instead of 1.1), from
    nine workloads (too few for a fitted prior): the inner cross-validation takes the rule
    times one fitted factor, and a workload it has never seen is predicted by it."""
    from iadeep_cli.model import fit
    from iadeep_cli.model.terms import ANALYTIC_THETA, SCALED_RULE, PriorForm

    profs, obs = _synthetic_lab(9, 45)
    obs = [dataclasses.replace(o, speeds=tuple(
        1.0 / (1.0 + 1.6 * profs[p].gpu_util / 100.0) for p in o.jobs[::-1])) for o in obs]
    new = "fam0-v0"
    m = fit_model(profs, [o for o in obs if new not in o.jobs])
    assert "analytic rule x1.45" in m.note       # 1.6 / 1.1
    assert m.theta == pytest.approx(1.6 / 1.1 * ANALYTIC_THETA, rel=0.01)   # grid step
    errs = [abs(m.predict_pair(profs[o.jobs[0]], profs[o.jobs[1]]).speed_a - o.speeds[0])
            for o in obs if new in o.jobs]
    assert errs and max(errs) < 0.01
    # the scaled rule is a setting of the inner cross-validation, kept by an incremental refit
    params = fit.fit_parameters(profs, obs)
    assert PriorForm.from_file(params["selection"]["ridge"]) == SCALED_RULE
    rows = params["selection"]["rows"]
    assert fit._reusable(params, params["gpu_model"], rows, 9, (1.0,)) is not None
    assert fit._reusable(params, params["gpu_model"], rows, 9, (1.0,), rule_scale=False) is None


def test_a_model_files_prior_form_is_written_as_earlier_versions_wrote_it():
    """The selection in a model file (which an incremental refit reuses) names the prior's form
    as earlier iadeep versions did (null: the rule itself, -1: the scaled rule, else a ridge's
    strength), so either version reads the other's file; nothing else reads as a prior form."""
    from iadeep_cli.model.terms import (
        PRIOR_RIDGE_GRID,
        RULE_ITSELF,
        SCALED_RULE,
        PriorForm,
        PriorKind,
    )

    forms = [RULE_ITSELF, SCALED_RULE, *(PriorForm(PriorKind.RIDGE, r) for r in PRIOR_RIDGE_GRID)]
    assert [f.to_file() for f in forms] == [None, -1.0, *PRIOR_RIDGE_GRID]
    assert [PriorForm.from_file(f.to_file()) for f in forms] == forms
    for bad in (0.0, -2.0, float("nan"), float("inf"), True, "x"):
        with pytest.raises(ValueError):
            PriorForm.from_file(bad)
    with pytest.raises(ValueError):
        PriorForm(PriorKind.SCALED_RULE, 0.3)

"""Nested held-out evaluation of learnt corrections from scikit-learn on top of the interference
model, on data whose workloads carry families (lucid-part: leave-one-family-out).

Each variant fits the model as shipped (``fit_model``), then a scikit-learn regressor on the
log-speed residual of its structural part *without* the workloads' own offsets (what a
workload of a family never seen gets), from pair features of the two profiles: both jobs'
gpu_util, mem_util and peak memory, and the pair's summed gpu_util and mem_util. The
regressor's correction, times a share (1 or 0.5), multiplies the speed of a job whose workload
was not in the training data; a known workload keeps the model's own offset. Regressors:
gradient boosting (absolute loss, depth 2, 60 trees), ridge on the standardised features
(alpha 10) and ridge on their degree-2 polynomial (alpha 30). One more variant averages the
shipped model's predictions with those of ``fit_model(..., scaled_first=True)``.

Every variant is scored alone (``model eval``'s figure for it) and as the nested choice
between the shipped model (first, so it wins ties) and the variants
(``evaluate.nested_cross_validate``: the choice is made inside every outer fold by
leave-one-family-out on that fold's training pairs only). Needs scikit-learn, which iadeep
itself does not use (``pip install scikit-learn``); a couple of minutes on a 2-core machine.

    PYTHONPATH=. .venv/bin/python benchmarks/sklearn_eval.py --lucid ../shared/data/lucid-part
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from iadeep_cli.model.predictor import InterferenceModel, PairPrediction
    from iadeep_cli.profiles import CoLocation, Profile

Interval = tuple[tuple[float, float], tuple[float, float]]

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def _pair_features(s: Profile, o: Profile) -> list[float]:
    return [s.gpu_util / 100, o.gpu_util / 100, s.mem_util / 100, o.mem_util / 100,
            (s.peak_mem_gib or 0.0) / 10, (o.peak_mem_gib or 0.0) / 10,
            (s.gpu_util + o.gpu_util) / 100, (s.mem_util + o.mem_util) / 100]


def _regressor(kind: str) -> Any:
    from sklearn.ensemble import GradientBoostingRegressor
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures, StandardScaler

    if kind == "gradient boosting":
        return GradientBoostingRegressor(loss="absolute_error", n_estimators=60, max_depth=2,
                                         learning_rate=0.05, min_samples_leaf=15,
                                         subsample=0.8, random_state=0)
    if kind == "ridge":
        return make_pipeline(StandardScaler(), Ridge(alpha=10.0))
    return make_pipeline(PolynomialFeatures(2, include_bias=False), StandardScaler(),
                         Ridge(alpha=30.0))


class _Corrected:
    """The model's predictions, a new workload's speed times exp(share x the regressor)."""

    def __init__(self, base: InterferenceModel, regressor: Any, share: float):
        self.base, self.regressor, self.share = base, regressor, share
        self.known = set(base.trained_on)

    def _factor(self, s: Profile, o: Profile) -> float:
        if s.workload in self.known:
            return 1.0
        x = np.array([_pair_features(s, o)])
        return math.exp(self.share * float(self.regressor.predict(x)[0]))

    def predict_pair(self, a: Profile, b: Profile) -> PairPrediction:
        from iadeep_cli.model.predictor import PairPrediction
        from iadeep_cli.model.terms import MAX_SPEED, MIN_SPEED

        p = self.base.predict_pair(a, b)
        fa, fb = self._factor(a, b), self._factor(b, a)
        return PairPrediction(float(np.clip(p.speed_a * fa, MIN_SPEED, MAX_SPEED)),
                              float(np.clip(p.speed_b * fb, MIN_SPEED, MAX_SPEED)),
                              p.confidence, p.method)

    def predict_interval(self, a: Profile, b: Profile, level: float = 0.8) -> Interval:
        (la, lb), (ha, hb) = self.base.predict_interval(a, b, level)
        fa, fb = self._factor(a, b), self._factor(b, a)
        return (la * fa, lb * fb), (ha * fa, hb * fb)


class _Average:
    """The mean of several models' predictions and interval ends."""

    def __init__(self, models: Sequence[InterferenceModel]):
        self.models = list(models)

    def predict_pair(self, a: Profile, b: Profile) -> PairPrediction:
        from iadeep_cli.model.predictor import PairPrediction

        ps = [m.predict_pair(a, b) for m in self.models]
        return PairPrediction(float(np.mean([p.speed_a for p in ps])),
                              float(np.mean([p.speed_b for p in ps])),
                              ps[0].confidence, ps[0].method)

    def predict_interval(self, a: Profile, b: Profile, level: float = 0.8) -> Interval:
        ends = [m.predict_interval(a, b, level) for m in self.models]
        lo = [float(np.mean([e[0][i] for e in ends])) for i in range(2)]
        hi = [float(np.mean([e[1][i] for e in ends])) for i in range(2)]
        return (lo[0], lo[1]), (hi[0], hi[1])


def _corrected_variant(kind: str, share: float) -> Callable[[Mapping[str, str]], Callable]:
    from iadeep_cli.model.predictor import fit_model
    from iadeep_cli.model.terms import MAX_SPEED, MIN_SPEED

    def factory(groups: Mapping[str, str]) -> Callable:
        def fit(profiles: Mapping[str, Profile], observations: Sequence[CoLocation]
                ) -> _Corrected:
            base = fit_model(profiles, observations, groups=groups)
            structural = replace(base, offsets={}, observed={}, _cache={})
            x, r = [], []
            for o in observations:
                if len(o.jobs) != 2 or not all(j in profiles for j in o.jobs):
                    continue
                a, b = (profiles[j] for j in o.jobs)
                speeds, _, _ = structural._structural(a, b)
                speeds = np.clip(speeds, MIN_SPEED, MAX_SPEED)
                for s, t, y, pred in ((a, b, o.speeds[0], speeds[0]),
                                      (b, a, o.speeds[1], speeds[1])):
                    x.append(_pair_features(s, t))
                    r.append(math.log(max(y, MIN_SPEED)) - math.log(pred))
            regressor = _regressor(kind).fit(np.array(x), np.array(r))
            return _Corrected(base, regressor, share)
        return fit
    return factory


def _average_variant(groups: Mapping[str, str]) -> Callable:
    from iadeep_cli.model.predictor import fit_model

    return lambda p, o: _Average([fit_model(p, o, groups=groups),
                                  fit_model(p, o, groups=groups, scaled_first=True)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lucid", type=Path, default=SHARED / "lucid-part",
                    help="the lucid-part folder (default: ../shared/data/lucid-part)")
    a = ap.parse_args()
    try:
        import sklearn  # noqa: F401
    except ImportError:
        sys.exit("error: this benchmark needs scikit-learn (pip install scikit-learn)")
    if not (a.lucid / "pairs.csv").is_file():
        sys.exit(f"error: no pairs.csv in {a.lucid}; give the lucid-part folder with --lucid")
    from iadeep_cli.model.data import family_of, load_pairs_csv, load_profiles_csv
    from iadeep_cli.model.evaluate import LOFO, nested_cross_validate
    from iadeep_cli.model.predictor import fit_model

    profiles = load_profiles_csv(a.lucid / "profiles.csv")
    pairs = load_pairs_csv(a.lucid / "pairs.csv")
    fams = {w: family_of(w) for w in profiles}
    shipped = {"model as shipped": lambda g: (lambda p, o: fit_model(p, o, groups=g))}
    learnt = {f"{kind} x{share:g}": _corrected_variant(kind, share)
              for kind in ("gradient boosting", "ridge", "ridge, degree 2")
              for share in (1.0, 0.5)}
    runs: list[tuple[str, dict]] = [(n, {n: v}) for n, v in {**shipped, **learnt}.items()]
    runs += [("average with scaled first", {"average": _average_variant}),
             ("nested: shipped or a learnt correction", {**shipped, **learnt}),
             ("nested: shipped or the average", {**shipped, "average": _average_variant})]
    print(f"lucid-part, {LOFO}: {len(pairs)} pairs")
    print(f"{'variant(s)':<42} {'MAE':>7} {'util sum':>8} {'80% cov':>7} {'time':>5}  "
          "per held-out family; chosen")
    for name, variants in runs:
        t0 = time.perf_counter()
        res = nested_cross_validate(profiles, pairs, fams, variants, protocol=LOFO)
        r = res.outer
        per = ", ".join(f"{g} {v:.3f}" for g, v in sorted(r.per_workload.items()))
        picks = ("" if len(variants) == 1 else
                 "; " + ", ".join(f"{g}: {v}" for g, v in sorted(res.chosen.items())))
        print(f"{name:<42} {r.mae_model:7.4f} {r.mae_util_sum_baseline:8.4f} "
              f"{100 * r.coverage:6.1f}% {time.perf_counter() - t0:4.0f}s  {per}{picks}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Pairwise interference predictor: an analytic prior plus a learned, strongly damped correction.

Why this shape
--------------
* Under the default time-slicing two busy jobs each get a little under half the GPU, and a job
  sharing with a mostly idle partner barely notices it. The prior says exactly that and nothing
  more: ``speed_self = 1 / (1 + c * util_other)`` with ``c = 1.1`` (10 % context-switch cost,
  so two saturated jobs get ~0.48 each; measured ~0.46). It needs only ``gpu_util``, which every
  NVIDIA GPU reports, and it errs on the side of predicting *more* interference: that is the
  conservative fallback when there are too few measurements.
* The learned part is a Gaussian-process regression (scikit-learn, fixed, strongly regularised
  kernel: no hyper-parameter search on seven workloads) of the *residual* measured - prior, on a
  handful of utilisation features of (self, partner). Far from the measured workloads the kernel
  decays and the prediction returns to the prior, so an unseen workload gets a physically sane
  answer instead of an extrapolated line. The posterior variance gives the confidence.
* ``predict(a, b)`` is one function ``f(self, partner)`` evaluated both ways, so swapping the pair
  swaps the answer exactly.
* Several feature sets are fitted (GPM metrics when measured, utilisation + board power, plain
  utilisation); a pair uses the richest set that both profiles (and the training data) have.
* The fitted model is stored as plain arrays in JSON and predicts with numpy only: importing
  scikit-learn costs ~2 s, which ``iadeep model predict`` and the scheduler must not pay.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import InputError, ModelError
from ..profiles import CoLocation, Profile

MODEL_FORMAT = "iadeep-interference-model"
MODEL_VERSION = 1

PRIOR_C = 1.1           # 1 + context-switch overhead of time-slicing (see module docstring)
MIN_SPEED, MAX_SPEED = 0.02, 1.05
MIN_PAIRS = 3           # fewer distinct measured pairs than this: analytic fallback
ANALYTIC_CONFIDENCE = 0.2

# Residual GP settings, chosen for generalisation (not tuned per workload): prior std of the
# correction 0.2 in speed, observation noise std 0.1 (per measurement; divided by `samples`).
GP_AMPLITUDE = 0.04
GP_NOISE = 0.01

# Known board power limits (W) for GPUs whose profiles may lack power_limit_w (as nvidia-smi
# reports power.limit at default settings). Used only to make power comparable across GPUs.
BOARD_POWER_LIMIT_W = {
    "NVIDIA H200": 700.0,
    "NVIDIA H100 80GB HBM3": 700.0,
    "NVIDIA A100-SXM4-80GB": 400.0,
    "NVIDIA A100-SXM4-40GB": 400.0,
}

# Feature sets, richest first: (name, per-job features, RBF length scale per feature).
# Utilisation carries the signal; power and the GPM metrics refine it with longer length
# scales so they cannot dominate the distance (they are noisier and seen on fewer GPUs).
FEATURE_SETS: tuple[tuple[str, tuple[str, ...], tuple[float, ...]], ...] = (
    ("gpm", ("gpu_util", "sm_util", "sm_occupancy", "tensor_util"), (0.25, 0.4, 0.4, 0.4)),
    ("power", ("gpu_util", "power"), (0.2, 0.6)),
    ("util", ("gpu_util",), (0.2,)),
)


def _power_fraction(p: Profile) -> float | None:
    limit = p.power_limit_w or BOARD_POWER_LIMIT_W.get(p.gpu_model)
    if p.power_w is None or not limit:
        return None
    return min(p.power_w / limit, 1.2)


def job_features(p: Profile, names: Sequence[str]) -> np.ndarray | None:
    """One job's features as fractions (0..1), or None when the profile lacks one of them."""
    out = []
    for n in names:
        v = _power_fraction(p) if n == "power" else getattr(p, n)
        if v is None:
            return None
        out.append(v if n == "power" else v / 100.0)
    return np.asarray(out, dtype=float)


def analytic_speed(util_other: np.ndarray | float) -> np.ndarray | float:
    """The prior: a job's speed next to a partner that keeps the GPU ``util_other`` busy."""
    return 1.0 / (1.0 + PRIOR_C * np.clip(util_other, 0.0, 1.0))


def util_sum_speed(util_self: float, util_other: float) -> float:
    """Baseline from the issue: both jobs slowed by the over-subscription of summed utilisation."""
    return 1.0 / max(1.0, util_self + util_other)


@dataclass(frozen=True)
class PairPrediction:
    speed_a: float
    speed_b: float
    confidence: float   # 0..1
    method: str         # "model" | "analytic"


@dataclass(frozen=True)
class ResidualGP:
    """A fitted residual GP stored as arrays: predicts with numpy only."""

    name: str
    features: tuple[str, ...]
    length_scales: np.ndarray   # (2k,) self features then partner features
    x_train: np.ndarray         # (n, 2k)
    alpha: np.ndarray           # (n,)  K^-1 residual
    k_inv: np.ndarray           # (n, n) for the posterior variance
    amplitude: float

    def _kernel(self, x: np.ndarray) -> np.ndarray:
        d = (x[:, None, :] - self.x_train[None, :, :]) / self.length_scales
        return self.amplitude * np.exp(-0.5 * np.einsum("ijk,ijk->ij", d, d))

    def correct(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Residual mean and a 0..1 confidence (1 - posterior std / prior std) for rows x."""
        k = self._kernel(x)
        mean = k @ self.alpha
        var = self.amplitude - np.einsum("ij,jk,ik->i", k, self.k_inv, k)
        conf = 1.0 - np.sqrt(np.clip(var, 0.0, None) / self.amplitude)
        return mean, np.clip(conf, 0.0, 1.0)

    def to_dict(self) -> dict:
        return {"name": self.name, "features": list(self.features),
                "length_scales": self.length_scales.tolist(), "x_train": self.x_train.tolist(),
                "alpha": self.alpha.tolist(), "k_inv": self.k_inv.tolist(),
                "amplitude": self.amplitude}

    @classmethod
    def from_dict(cls, d: dict) -> ResidualGP:
        return cls(d["name"], tuple(d["features"]), np.asarray(d["length_scales"], float),
                   np.asarray(d["x_train"], float).reshape(len(d["alpha"]), -1),
                   np.asarray(d["alpha"], float), np.asarray(d["k_inv"], float),
                   float(d["amplitude"]))


@dataclass
class InterferenceModel:
    """Predicts co-location speeds. With no fitted GPs it is the analytic fallback."""

    gpu_model: str = ""
    gps: tuple[ResidualGP, ...] = ()
    note: str = ""                       # why it is analytic, what it was fitted on
    trained_on: tuple[str, ...] = ()     # workloads seen in training
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_analytic(self) -> bool:
        return not self.gps

    # -- prediction ------------------------------------------------------------------------
    def _choose(self, a: Profile, b: Profile):
        for gp in self.gps:
            fa, fb = job_features(a, gp.features), job_features(b, gp.features)
            if fa is not None and fb is not None:
                return gp, fa, fb
        return None, None, None

    def predict_pair(self, a: Profile, b: Profile) -> PairPrediction:
        key = (a, b)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._predict_uncached(a, b)
            self._cache[key] = hit
            self._cache[(b, a)] = PairPrediction(hit.speed_b, hit.speed_a, hit.confidence,
                                                 hit.method)
        return hit

    def _predict_uncached(self, a: Profile, b: Profile) -> PairPrediction:
        prior = analytic_speed(np.array([b.gpu_util, a.gpu_util]) / 100.0)
        gp, fa, fb = self._choose(a, b)
        if gp is None:
            s = np.clip(prior, MIN_SPEED, MAX_SPEED)
            return PairPrediction(float(s[0]), float(s[1]), ANALYTIC_CONFIDENCE, "analytic")
        x = np.vstack([np.concatenate([fa, fb]), np.concatenate([fb, fa])])
        resid, conf = gp.correct(x)
        s = np.clip(prior + resid, MIN_SPEED, MAX_SPEED)
        return PairPrediction(float(s[0]), float(s[1]), float(conf.min()), "model")

    def predict_many(self, pairs: Sequence[tuple[Profile, Profile]]) -> np.ndarray:
        """Speeds of each (a, b) pair as an (n, 2) array; repeated pairs are computed once."""
        out = np.empty((len(pairs), 2), dtype=float)
        for i, (a, b) in enumerate(pairs):
            p = self.predict_pair(a, b)
            out[i, 0], out[i, 1] = p.speed_a, p.speed_b
        return out

    def predict_group(self, profiles: Sequence[Profile]) -> tuple[float, ...]:
        """Speed of each job when all of them share one GPU.

        Composition rule for 3+ jobs: slowdowns add. A job at pairwise speed s_ij spends
        (1/s_ij - 1) extra time per unit of work because of partner j; with several partners
        those extra times add up: ``1/speed_i = 1 + sum_j (1/s_ij - 1)``. Time-slicing hands
        the GPU to each busy context in turn, so each extra partner adds its own wait.
        """
        n = len(profiles)
        if n == 0:
            return ()
        if n == 1:
            return (1.0,)
        extra = [0.0] * n
        for i in range(n):
            for j in range(i + 1, n):
                p = self.predict_pair(profiles[i], profiles[j])
                extra[i] += 1.0 / max(p.speed_a, MIN_SPEED) - 1.0
                extra[j] += 1.0 / max(p.speed_b, MIN_SPEED) - 1.0
        return tuple(float(min(MAX_SPEED, max(MIN_SPEED, 1.0 / (1.0 + max(e, -0.05)))))
                     for e in extra)

    def confidence(self, a: Profile, b: Profile) -> float:
        return self.predict_pair(a, b).confidence

    # -- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": MODEL_FORMAT, "version": MODEL_VERSION, "gpu_model": self.gpu_model,
                "prior_c": PRIOR_C, "note": self.note, "trained_on": list(self.trained_on),
                "gps": [g.to_dict() for g in self.gps]}

    def save(self, path) -> None:
        p = Path(path)
        try:
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(json.dumps(self.to_dict()), encoding="utf-8")
            tmp.replace(p)
        except OSError as exc:
            raise ModelError(f"{path}: cannot write model ({exc.strerror or exc})",
                             hint="choose a writable path for -o") from None

    @classmethod
    def load(cls, path) -> InterferenceModel:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelError(f"{path}: no such model file",
                             hint="create one with `iadeep model fit -o FILE`") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ModelError(f"{path}: not an iadeep model file ({type(exc).__name__})",
                             hint="refit it with `iadeep model fit -o FILE`") from None
        if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
            raise ModelError(f"{path}: not an iadeep interference model",
                             hint="refit it with `iadeep model fit -o FILE`")
        if data.get("version") != MODEL_VERSION:
            raise ModelError(f"{path}: model format version {data.get('version')!r}, this "
                             f"iadeep reads version {MODEL_VERSION}",
                             hint="refit it with this iadeep: `iadeep model fit -o FILE`")
        try:
            gps = tuple(ResidualGP.from_dict(g) for g in data["gps"])
            return cls(str(data.get("gpu_model", "")), gps, str(data.get("note", "")),
                       tuple(data.get("trained_on", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{path}: corrupt model file ({type(exc).__name__}: {exc})",
                             hint="refit it with `iadeep model fit -o FILE`") from None


# ---------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------
def merge_measurements(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
                       extra_profiles: Mapping[str, Profile] | None = None,
                       extra_observations: Sequence[CoLocation] | None = None,
                       ) -> tuple[dict[str, Profile], list[CoLocation]]:
    """Lab measurements override shipped ones: per (gpu_model, workload) for profiles, per
    (gpu_model, unordered job set) for co-location measurements."""
    merged = dict(profiles)
    for name, p in (extra_profiles or {}).items():
        merged[name] = p
    extra_obs = list(extra_observations or ())
    override = {(o.gpu_model, tuple(sorted(o.jobs))) for o in extra_obs}
    kept = [o for o in observations if (o.gpu_model, tuple(sorted(o.jobs))) not in override]
    return merged, kept + extra_obs


def _directed_rows(profiles: Mapping[str, Profile], observations: Sequence[CoLocation]):
    """(self, partner, speed, samples) for every pair measurement whose workloads we know."""
    rows = []
    for o in observations:
        if len(o.jobs) != 2 or not all(j in profiles for j in o.jobs):
            continue
        a, b = (profiles[j] for j in o.jobs)
        rows.append((a, b, o.speeds[0], o.samples))
        rows.append((b, a, o.speeds[1], o.samples))
    return rows


def _fit_gp(name: str, feats: tuple[str, ...], ls: tuple[float, ...], rows) -> ResidualGP | None:
    usable = []
    for a, b, y, n in rows:
        fa, fb = job_features(a, feats), job_features(b, feats)
        if fa is not None and fb is not None:
            usable.append((np.concatenate([fa, fb]), y - float(analytic_speed(b.gpu_util / 100)),
                           n, (a.workload, b.workload)))
    if len({frozenset(u[3]) for u in usable}) < MIN_PAIRS:
        return None
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    x = np.vstack([u[0] for u in usable])
    r = np.array([u[1] for u in usable])
    noise = GP_NOISE / np.array([max(1, u[2]) for u in usable], dtype=float)
    scales = np.array(ls + ls, dtype=float)
    kernel = ConstantKernel(GP_AMPLITUDE, "fixed") * RBF(scales, "fixed")
    gpr = GaussianProcessRegressor(kernel, alpha=noise, optimizer=None, normalize_y=False)
    gpr.fit(x, r)
    k = kernel(x) + np.diag(noise)
    return ResidualGP(name, feats, scales, x, np.asarray(gpr.alpha_, float).ravel(),
                      np.linalg.inv(k), GP_AMPLITUDE)


def _majority_gpu(profiles: Mapping[str, Profile]) -> str:
    models = Counter(p.gpu_model for p in profiles.values() if p.gpu_model)
    return models.most_common(1)[0][0] if models else ""


def fit_model(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
              gpu_model: str | None = None, *,
              extra_profiles: Mapping[str, Profile] | None = None,
              extra_observations: Sequence[CoLocation] | None = None) -> InterferenceModel:
    """Fit on pair measurements of one GPU model (triples are not used for fitting).

    ``extra_*`` (the lab's own measurements) override the given ones per gpu_model+workload.
    With fewer than MIN_PAIRS distinct measured pairs the result is the analytic model, and
    its ``note`` says so.
    """
    profiles, observations = merge_measurements(profiles, observations, extra_profiles,
                                                extra_observations)
    gpu = gpu_model if gpu_model is not None else _majority_gpu(profiles)
    profiles = {k: p for k, p in profiles.items() if not gpu or p.gpu_model in ("", gpu)}
    observations = [o for o in observations if not gpu or o.gpu_model in ("", gpu)]
    rows = _directed_rows(profiles, observations)
    for a, b, y, _ in rows:
        if not 0.0 < y <= 2.0:
            raise InputError(f"measured speed {y} for {a.workload} next to {b.workload} is "
                             "outside (0, 2]", hint="speed = co-located / solo throughput")
    gps = tuple(g for g in (_fit_gp(n, f, ls, rows) for n, f, ls in FEATURE_SETS) if g)
    trained = tuple(sorted({r[0].workload for r in rows}))
    if not gps:
        note = (f"analytic fallback: only {len(rows) // 2} usable pair measurements for "
                f"{gpu or 'this GPU'} (need {MIN_PAIRS} distinct pairs)")
        return InterferenceModel(gpu, (), note, trained)
    note = (f"fitted on {len(rows) // 2} pair measurements of {len(trained)} workloads "
            f"({gpu or 'unknown GPU'}); feature sets: {', '.join(g.name for g in gps)}")
    return InterferenceModel(gpu, gps, note, trained)


def analytic_model(gpu_model: str = "") -> InterferenceModel:
    """The conservative no-data fallback (same API as a fitted model)."""
    return InterferenceModel(gpu_model, (), "analytic fallback: no measurements used", ())


@lru_cache(maxsize=1)
def default_model() -> InterferenceModel:
    """Fitted on the shipped H200 data; cached per process (fitting imports scikit-learn)."""
    from .data import shipped_pairs, shipped_profiles

    return fit_model(shipped_profiles(), shipped_pairs())


def gpu_mismatch(model: InterferenceModel, profiles: Mapping[str, Profile]) -> str | None:
    """A warning line when the profiles were measured on another GPU model than the model's."""
    others = sorted({p.gpu_model for p in profiles.values()
                     if p.gpu_model and model.gpu_model and p.gpu_model != model.gpu_model})
    if not others:
        return None
    return (f"model was fitted for {model.gpu_model!r} but profiles are from "
            f"{', '.join(map(repr, others))}; predictions may be off")


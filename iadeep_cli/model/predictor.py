"""Pairwise interference predictor: a fitted physical prior, a damped learned correction,
calibrated intervals, and the lab's own observations of a pair on top.

Why this shape
--------------
* Prior (a few parameters per GPU model). Under the default time-slicing two busy jobs each get
  a little under half the GPU, and a job next to a mostly idle partner barely notices it. The
  slowdown ``1/speed - 1`` is modelled as a non-negative combination of physically meaningful
  terms of (self, partner): the partner's utilisation weighted by how busy the victim is and by
  how idle it is (a launch-bound job waits for every time slice of a busy partner on an H200;
  the same job is unaffected on GPUs that interleave), the over-subscription of summed
  utilisation and of summed memory-bandwidth utilisation (``max(0, u_a + u_b - 1)``), plus an
  intercept (speeds slightly above 1 happen). Only gpu_util and mem_util are needed: every NVIDIA
  GPU reports them. Non-negative coefficients make the prior monotonic: a busier partner never
  makes a job faster. The coefficients are shrunk toward the analytic estimate
  ``1 / (1 + 1.1 u_partner)`` (ridge penalty toward it), so with thin data the prior *is* the
  analytic estimate, and with many measured pairs of a GPU model it is that GPU's physics.
* Correction: a Gaussian process (fixed, strongly regularised kernel) on the residual measured -
  prior, on utilisation (and power / GPM metrics when both profiles have them). Far from the
  measured workloads the kernel decays and the prediction returns to the prior.
* How strongly to shrink the prior and how much correction to allow are chosen by grouped
  cross-validation *inside the training data* (workload families held out when the names carry
  them, else workloads), never by looking at held-out data. The same inner cross-validation's
  out-of-group residuals calibrate the intervals (split-conformal): ``predict_interval(a, b,
  0.8)`` covers the measured speed of an unseen workload about 80 % of the time.
* The lab's own observations win: a pair that has been measured is predicted as the precision-
  weighted mean of the model's estimate (its variance from the calibration, or the squared
  disagreement with the measurements if that is larger) and the mean of the measurements (noise
  std ``OBS_NOISE``), so after one or two observations the prediction follows them, and its
  interval narrows with every further one.
* ``predict(a, b)`` is one function ``f(self, partner)`` evaluated both ways, so swapping the pair
  swaps the answer exactly.
* The fitted model is stored as plain arrays in JSON and predicts with numpy only (fitting uses
  scipy, which scikit-learn brings): ``iadeep model predict`` and the scheduler must not pay for
  importing either.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import InputError, ModelError
from ..profiles import CoLocation, Profile

MODEL_FORMAT = "iadeep-interference-model"
MODEL_VERSION = 2

PRIOR_C = 1.1           # 1 + context-switch overhead of time-slicing (see module docstring)
MIN_SPEED, MAX_SPEED = 0.02, 1.05
MIN_PAIRS = 3           # fewer distinct measured pairs than this: analytic fallback
ANALYTIC_CONFIDENCE = 0.2

# Residual GP settings, chosen for generalisation (not tuned per workload): prior variance of the
# correction GP_AMPLITUDE (std 0.2 in speed), observation noise variance GP_NOISE (std 0.1 per
# measurement; divided by `samples`). Inner cross-validation may scale the amplitude down.
GP_AMPLITUDE = 0.04
GP_NOISE = 0.01

# Candidates for the inner cross-validation: ridge strength of the prior toward the analytic
# estimate (with MIN_PRIOR_WORKLOADS or more workloads; below that it is the analytic estimate)
# and the correction's amplitude.
PRIOR_RIDGE_GRID: tuple[float, ...] = (3.0, 0.3, 0.03)
GP_AMPLITUDE_GRID: tuple[float, ...] = (0.0, 0.01, GP_AMPLITUDE)
INNER_FOLDS = 8         # at most this many inner folds (groups are dealt round-robin)
# The prior has six coefficients: fitting them needs measurements of at least this many
# workloads (two per coefficient); with fewer the prior stays the analytic estimate and only the
# (local) correction learns. With the seven H200 workloads a fitted prior extrapolates badly to
# a kind of job it has not seen (mlp, the one launch-bound workload, held out: 0.27 vs 0.08).
MIN_PRIOR_WORKLOADS = 12

# Measurement noise of one co-location measurement (std, speed units): repeated H200
# measurements of the same pair differ by 0.019 on average, i.e. a std of ~0.017 each.
OBS_NOISE = 0.02

# With no calibration data (analytic fallback) the interval is wide: +- this at level 0.8.
ANALYTIC_HALF_WIDTH_80 = 0.3

# Known board power limits (W) for GPUs whose profiles may lack power_limit_w (as nvidia-smi
# reports power.limit at default settings). Used only to make power comparable across GPUs.
BOARD_POWER_LIMIT_W = {
    "NVIDIA H200": 700.0,
    "NVIDIA H100 80GB HBM3": 700.0,
    "NVIDIA A100-SXM4-80GB": 400.0,
    "NVIDIA A100-SXM4-40GB": 400.0,
}

# Feature sets of the correction, richest first: (name, per-job features, RBF length scale per
# feature). Utilisation carries the signal; power and the GPM metrics refine it with longer
# length scales so they cannot dominate the distance (they are noisier and seen on fewer GPUs).
FEATURE_SETS: tuple[tuple[str, tuple[str, ...], tuple[float, ...]], ...] = (
    ("gpm", ("gpu_util", "sm_util", "sm_occupancy", "tensor_util"), (0.25, 0.4, 0.4, 0.4)),
    ("power", ("gpu_util", "power"), (0.2, 0.6)),
    ("util", ("gpu_util",), (0.2,)),
)

# The prior's slowdown terms (self s, partner o; u = gpu_util, m = mem_util as fractions).
PRIOR_TERMS = ("intercept", "u_s*u_o", "(1-u_s)*u_o", "max(0,u_s+u_o-1)", "m_s*m_o",
               "max(0,m_s+m_o-1)")
# The analytic estimate in these terms: 1.1 * u_o = 1.1 * (u_s u_o + (1 - u_s) u_o).
ANALYTIC_THETA = np.array([0.0, PRIOR_C, PRIOR_C, 0.0, 0.0, 0.0])
PRIOR_LOWER = np.array([-0.1, 0.0, 0.0, 0.0, 0.0, 0.0])   # >= 0: monotonic in the partner


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


def prior_terms(s: Profile, o: Profile) -> np.ndarray:
    """The prior's slowdown terms for job ``s`` next to partner ``o`` (see PRIOR_TERMS)."""
    us, uo = min(s.gpu_util, 100.0) / 100.0, min(o.gpu_util, 100.0) / 100.0
    ms, mo = min(s.mem_util, 100.0) / 100.0, min(o.mem_util, 100.0) / 100.0
    return np.array([1.0, us * uo, (1.0 - us) * uo, max(0.0, us + uo - 1.0), ms * mo,
                     max(0.0, ms + mo - 1.0)])


def prior_speed(theta: np.ndarray, terms: np.ndarray) -> np.ndarray:
    """Speed from slowdown terms: ``1 / (1 + theta . terms)`` (rows of ``terms``)."""
    return 1.0 / (1.0 + np.maximum(terms @ theta, -0.5))


def analytic_speed(util_other: np.ndarray | float) -> np.ndarray | float:
    """The analytic estimate: a job's speed next to a partner keeping the GPU ``util_other``
    busy (``ANALYTIC_THETA`` in the prior's terms)."""
    return 1.0 / (1.0 + PRIOR_C * np.clip(util_other, 0.0, 1.0))


def util_sum_speed(util_self: float, util_other: float) -> float:
    """Baseline from the issue: both jobs slowed by the over-subscription of summed utilisation."""
    return 1.0 / max(1.0, util_self + util_other)


@dataclass(frozen=True)
class PairPrediction:
    speed_a: float
    speed_b: float
    confidence: float   # 0..1
    method: str         # "model" | "analytic" | "observed"


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


# Calibration: quantiles of |held-out error| at these levels (interpolated in between).
CAL_LEVELS = (*(round(0.05 * i, 2) for i in range(1, 20)), 0.975, 0.99)


def _analytic_calibration() -> tuple[float, ...]:
    # No data: a wide interval, proportional to the level (+- ANALYTIC_HALF_WIDTH_80 at 0.8).
    return tuple(min(1.0, ANALYTIC_HALF_WIDTH_80 * lv / 0.8) for lv in CAL_LEVELS)


@dataclass
class InterferenceModel:
    """Predicts co-location speeds. With no fitted GPs and the analytic prior it is the
    analytic fallback."""

    gpu_model: str = ""
    gps: tuple[ResidualGP, ...] = ()
    note: str = ""                       # why it is analytic, what it was fitted on
    trained_on: tuple[str, ...] = ()     # workloads seen in training
    theta: np.ndarray = field(default_factory=lambda: ANALYTIC_THETA.copy())
    # |error| quantiles at CAL_LEVELS on held-out groups (inner cross-validation)
    calibration: tuple[float, ...] = field(default_factory=_analytic_calibration)
    # the measured pairs: (self, partner) -> (sum of speed x samples, samples)
    observed: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    fitted: bool = False                 # False: the analytic fallback
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_analytic(self) -> bool:
        return not self.fitted

    # -- prediction ------------------------------------------------------------------------
    def _choose(self, a: Profile, b: Profile):
        for gp in self.gps:
            fa, fb = job_features(a, gp.features), job_features(b, gp.features)
            if fa is not None and fb is not None:
                return gp, fa, fb
        return None, None, None

    def _half_width(self, level: float) -> float:
        if not 0.0 < level < 1.0:
            raise InputError(f"interval level {level} must be between 0 and 1",
                             hint="e.g. 0.8 for an 80% interval")
        return float(np.interp(level, (0.0, *CAL_LEVELS), (0.0, *self.calibration)))

    def _structural(self, a: Profile, b: Profile) -> tuple[np.ndarray, float, str]:
        """Speeds (a, b) from prior + correction, confidence, method (no observations)."""
        prior = prior_speed(self.theta, np.vstack([prior_terms(a, b), prior_terms(b, a)]))
        gp, fa, fb = self._choose(a, b)
        if gp is None:
            return prior, ANALYTIC_CONFIDENCE, "model" if self.fitted else "analytic"
        x = np.vstack([np.concatenate([fa, fb]), np.concatenate([fb, fa])])
        resid, conf = gp.correct(x)
        return prior + resid, float(conf.min()), "model"

    def _predict_uncached(self, a: Profile, b: Profile) -> tuple[PairPrediction, np.ndarray]:
        """The prediction and, per speed, the interval scale (1 = unobserved; < 1 once the pair
        has been measured)."""
        s, conf, method = self._structural(a, b)
        scale = np.ones(2)
        sigma = self._half_width(0.6827)           # ~1 std of the model's held-out error
        for i, key in enumerate(((a.workload, b.workload), (b.workload, a.workload))):
            hit = self.observed.get(key)
            if hit is None or sigma <= 0:
                continue
            total, n = hit
            # measurements that contradict the model make it less sure of itself: its variance
            # is at least the squared disagreement (so a pair it gets wrong by 0.3 follows the
            # first measurement instead of averaging with a confidently wrong estimate)
            var_model = max(sigma ** 2, (total / n - s[i]) ** 2)
            prec_model, prec_obs = 1.0 / var_model, n / OBS_NOISE ** 2
            w = prec_obs / (prec_model + prec_obs)
            s[i] = (1.0 - w) * s[i] + w * (total / n)
            scale[i] = np.sqrt(1.0 - w)
            method = "observed"
            conf = max(conf, float(1.0 - scale[i]))
        s = np.clip(s, MIN_SPEED, MAX_SPEED)
        return PairPrediction(float(s[0]), float(s[1]), float(conf), method), scale

    def _lookup(self, a: Profile, b: Profile) -> tuple[PairPrediction, np.ndarray]:
        key = (a, b)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._predict_uncached(a, b)
            p, scale = hit
            self._cache[key] = hit
            self._cache[(b, a)] = (PairPrediction(p.speed_b, p.speed_a, p.confidence,
                                                  p.method), scale[::-1].copy())
        return hit

    def predict_pair(self, a: Profile, b: Profile) -> PairPrediction:
        return self._lookup(a, b)[0]

    def predict_interval(self, a: Profile, b: Profile, level: float = 0.8
                         ) -> tuple[tuple[float, float], tuple[float, float]]:
        """((low_a, low_b), (high_a, high_b)): an interval per speed meant to hold the measured
        speed with probability ``level`` (calibrated on held-out workload groups; narrower for
        a pair the lab has measured)."""
        p, scale = self._lookup(a, b)
        half = self._half_width(level) * scale
        mid = np.array([p.speed_a, p.speed_b])
        lo, hi = np.clip(mid - half, 0.0, None), mid + half
        return (float(lo[0]), float(lo[1])), (float(hi[0]), float(hi[1]))

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
                "prior_terms": list(PRIOR_TERMS), "theta": self.theta.tolist(),
                "fitted": self.fitted, "note": self.note, "trained_on": list(self.trained_on),
                "calibration_levels": list(CAL_LEVELS), "calibration": list(self.calibration),
                "observed": [[a, b, t, n] for (a, b), (t, n) in sorted(self.observed.items())],
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
            if (tuple(data["prior_terms"]) != PRIOR_TERMS
                    or tuple(data["calibration_levels"]) != CAL_LEVELS):
                raise ValueError("prior terms or calibration levels differ from this iadeep's")
            gps = tuple(ResidualGP.from_dict(g) for g in data["gps"])
            observed = {(str(a), str(b)): (float(t), float(n)) for a, b, t, n in data["observed"]}
            return cls(str(data.get("gpu_model", "")), gps, str(data.get("note", "")),
                       tuple(data.get("trained_on", ())), np.asarray(data["theta"], float),
                       tuple(float(c) for c in data["calibration"]), observed,
                       bool(data["fitted"]))
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


@dataclass(frozen=True)
class _Row:
    s: Profile          # the job whose speed this is
    o: Profile          # its partner
    y: float            # measured speed
    n: int              # samples


def _directed_rows(profiles: Mapping[str, Profile], observations: Sequence[CoLocation]
                   ) -> list[_Row]:
    """One row per speed of every pair measurement whose workloads we know."""
    rows = []
    for o in observations:
        if len(o.jobs) != 2 or not all(j in profiles for j in o.jobs):
            continue
        a, b = (profiles[j] for j in o.jobs)
        rows.append(_Row(a, b, o.speeds[0], o.samples))
        rows.append(_Row(b, a, o.speeds[1], o.samples))
    return rows


def _fit_prior(rows: Sequence[_Row], ridge: float | None) -> np.ndarray:
    """Least squares in speed, coefficients >= PRIOR_LOWER, ridge toward ANALYTIC_THETA."""
    if ridge is None or not rows:
        return ANALYTIC_THETA.copy()
    from scipy.optimize import least_squares  # type: ignore[import-untyped]

    x = np.vstack([prior_terms(r.s, r.o) for r in rows])
    y = np.array([r.y for r in rows])
    w = np.sqrt(np.array([r.n for r in rows], dtype=float))
    pen = np.sqrt(ridge)

    def resid(theta: np.ndarray) -> np.ndarray:
        return np.concatenate([w * (prior_speed(theta, x) - y), pen * (theta - ANALYTIC_THETA)])

    start = np.maximum(ANALYTIC_THETA, PRIOR_LOWER)
    return np.asarray(least_squares(resid, start, bounds=(PRIOR_LOWER, np.inf)).x, float)


def _fit_gp(name: str, feats: tuple[str, ...], ls: tuple[float, ...], rows: Sequence[_Row],
            theta: np.ndarray, amplitude: float) -> ResidualGP | None:
    usable = []
    for r in rows:
        fa, fb = job_features(r.s, feats), job_features(r.o, feats)
        if fa is not None and fb is not None:
            resid = r.y - float(prior_speed(theta, prior_terms(r.s, r.o)))
            usable.append((np.concatenate([fa, fb]), resid, r.n, (r.s.workload, r.o.workload)))
    if amplitude <= 0 or len({frozenset(u[3]) for u in usable}) < MIN_PAIRS:
        return None
    x = np.vstack([u[0] for u in usable])
    resid_y = np.array([u[1] for u in usable])
    noise = GP_NOISE / np.array([max(1, u[2]) for u in usable], dtype=float)
    scales = np.array(ls + ls, dtype=float)
    d = (x[:, None, :] - x[None, :, :]) / scales
    k = amplitude * np.exp(-0.5 * np.einsum("ijk,ijk->ij", d, d)) + np.diag(noise)
    k_inv = np.linalg.inv(k)
    return ResidualGP(name, feats, scales, x, k_inv @ resid_y, k_inv, amplitude)


def _fit_structure(rows: Sequence[_Row], ridge: float | None, amplitude: float
                   ) -> tuple[np.ndarray, tuple[ResidualGP, ...]]:
    theta = _fit_prior(rows, ridge)
    gps = tuple(g for g in (_fit_gp(n, f, ls, rows, theta, amplitude)
                            for n, f, ls in FEATURE_SETS) if g)
    return theta, gps


def _predict_rows(theta: np.ndarray, gps: Sequence[ResidualGP], rows: Sequence[_Row]
                  ) -> np.ndarray:
    """Structural speeds (no observations, clipped) of many rows at once: the same numbers as
    ``InterferenceModel.predict_pair``, batched for cross-validation."""
    out = prior_speed(theta, np.vstack([prior_terms(r.s, r.o) for r in rows]))
    todo = list(range(len(rows)))
    for gp in gps:
        feats = [(i, job_features(rows[i].s, gp.features), job_features(rows[i].o, gp.features))
                 for i in todo]
        use = [(i, fa, fb) for i, fa, fb in feats if fa is not None and fb is not None]
        if use:
            idx = np.array([u[0] for u in use])
            x = np.vstack([np.concatenate([fa, fb]) for _, fa, fb in use])
            out[idx] += gp.correct(x)[0]
        todo = [i for i, fa, fb in feats if fa is None or fb is None]
    return np.clip(out, MIN_SPEED, MAX_SPEED)


def _majority_gpu(profiles: Mapping[str, Profile]) -> str:
    models = Counter(p.gpu_model for p in profiles.values() if p.gpu_model)
    return models.most_common(1)[0][0] if models else ""


def default_groups(workloads: Sequence[str]) -> dict[str, str]:
    """Inner cross-validation groups: families (``family-...`` names) when there are three or
    more and one has two or more members, else each workload alone."""
    from .data import family_of

    fams = {w: family_of(w) for w in workloads}
    members = Counter(fams.values())
    if len(members) >= 3 and max(members.values()) > 1:
        return fams
    return {w: w for w in workloads}


def _inner_cv(rows: Sequence[_Row], groups: Mapping[str, str]
              ) -> tuple[float | None, float, np.ndarray]:
    """Choose (prior ridge, GP amplitude) by grouped cross-validation on the training rows;
    return them and the chosen setting's held-out |errors| (for the interval calibration)."""
    names = sorted({groups.get(w, w) for r in rows for w in (r.s.workload, r.o.workload)})
    fold_of = {g: i % INNER_FOLDS for i, g in enumerate(names)}
    n_folds = min(INNER_FOLDS, len(names))

    def row_folds(r: _Row) -> set[int]:
        return {fold_of[groups.get(r.s.workload, r.s.workload)],
                fold_of[groups.get(r.o.workload, r.o.workload)]}

    folds = [row_folds(r) for r in rows]
    n_workloads = len({r.s.workload for r in rows})
    ridges: tuple[float | None, ...] = (
        PRIOR_RIDGE_GRID if n_workloads >= MIN_PRIOR_WORKLOADS else (None,))
    errors: dict[tuple[float | None, float], list[float]] = defaultdict(list)
    for k in range(n_folds):
        train = [r for r, f in zip(rows, folds) if k not in f]
        test = [r for r, f in zip(rows, folds) if k in f]
        if not train or not test:
            continue
        y = np.array([r.y for r in test])
        for ridge in ridges:
            theta = _fit_prior(train, ridge)
            for amp in GP_AMPLITUDE_GRID:
                gps = tuple(g for g in (_fit_gp(n, f, ls, train, theta, amp)
                                        for n, f, ls in FEATURE_SETS) if g)
                errors[(ridge, amp)] += np.abs(_predict_rows(theta, gps, test) - y).tolist()
    if not errors:
        return None, GP_AMPLITUDE, np.array([])
    best = min(errors, key=lambda c: float(np.mean(errors[c])))
    return best[0], best[1], np.asarray(errors[best])


def _calibration(abs_errors: np.ndarray) -> tuple[float, ...]:
    """Conformal quantiles of held-out |errors| at CAL_LEVELS (finite-sample corrected)."""
    n = len(abs_errors)
    if n < 10:
        return _analytic_calibration()
    srt = np.sort(abs_errors)
    return tuple(float(srt[min(n - 1, int(np.ceil((n + 1) * lv)) - 1)]) for lv in CAL_LEVELS)


def _observed_pairs(rows: Sequence[_Row]) -> dict[tuple[str, str], tuple[float, float]]:
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for r in rows:
        key = (r.s.workload, r.o.workload)
        total, n = out.get(key, (0.0, 0.0))
        out[key] = (total + r.y * r.n, n + r.n)
    return out


def fit_model(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
              gpu_model: str | None = None, *,
              extra_profiles: Mapping[str, Profile] | None = None,
              extra_observations: Sequence[CoLocation] | None = None,
              groups: Mapping[str, str] | None = None) -> InterferenceModel:
    """Fit on pair measurements of one GPU model (triples are not used for fitting).

    ``extra_*`` (the lab's own measurements) override the given ones per gpu_model+workload.
    ``groups`` (workload -> group) are the units the inner cross-validation holds out
    (default: ``default_groups``). With fewer than MIN_PAIRS distinct measured pairs the result
    is the analytic model, and its ``note`` says so.
    """
    profiles, observations = merge_measurements(profiles, observations, extra_profiles,
                                                extra_observations)
    gpu = gpu_model if gpu_model is not None else _majority_gpu(profiles)
    profiles = {k: p for k, p in profiles.items() if not gpu or p.gpu_model in ("", gpu)}
    observations = [o for o in observations if not gpu or o.gpu_model in ("", gpu)]
    rows = _directed_rows(profiles, observations)
    for r in rows:
        if not 0.0 < r.y <= 2.0:
            raise InputError(f"measured speed {r.y} for {r.s.workload} next to {r.o.workload} "
                             "is outside (0, 2]", hint="speed = co-located / solo throughput")
    trained = tuple(sorted({r.s.workload for r in rows}))
    n_pairs = len({frozenset((r.s.workload, r.o.workload)) for r in rows})
    if n_pairs < MIN_PAIRS:
        note = (f"analytic fallback: only {n_pairs} distinct measured pairs for "
                f"{gpu or 'this GPU'} (need {MIN_PAIRS})")
        return InterferenceModel(gpu, (), note, trained, observed=_observed_pairs(rows))
    grouping = dict(groups) if groups is not None else default_groups(trained)
    ridge, amp, held_out = _inner_cv(rows, grouping)
    theta, gps = _fit_structure(rows, ridge, amp)
    prior = "analytic prior" if ridge is None else f"prior fitted (ridge {ridge:g})"
    note = (f"fitted on {len(rows) // 2} pair measurements of {len(trained)} workloads "
            f"({gpu or 'unknown GPU'}); {prior}; correction: "
            f"{', '.join(g.name for g in gps) or 'none'}"
            f"{f' (amplitude {amp:g})' if gps else ''}")
    return InterferenceModel(gpu, gps, note, trained, theta, _calibration(held_out),
                             _observed_pairs(rows), fitted=True)


def analytic_model(gpu_model: str = "") -> InterferenceModel:
    """The conservative no-data fallback (same API as a fitted model)."""
    return InterferenceModel(gpu_model, (), "analytic fallback: no measurements used", ())


@lru_cache(maxsize=1)
def default_model() -> InterferenceModel:
    """Fitted on the shipped H200 data; cached per process (fitting imports scipy)."""
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


"""The interference model's vocabulary, shared by prediction (``predictor``) and fitting
(``fit``): constants, the prior's terms, the correction's features, the sparse residual GP as
stored arrays, the interval's widening. numpy only.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..profiles import CoLocation, Profile

MODEL_FORMAT = "iadeep-interference-model"
MODEL_VERSION = 3

PRIOR_C = 1.1           # 1 + context-switch overhead of time-slicing (see module docstring)
MIN_SPEED, MAX_SPEED = 0.02, 1.05
MIN_PAIRS = 3           # fewer distinct measured pairs than this: analytic fallback
ANALYTIC_CONFIDENCE = 0.2

# Residual GP settings, chosen for generalisation (not tuned per workload): prior variance of the
# correction GP_AMPLITUDE (std 0.2 in speed), observation noise variance GP_NOISE (std 0.1 per
# measurement; divided by `samples`). Inner cross-validation may scale the amplitude down.
GP_AMPLITUDE = 0.04
GP_NOISE = 0.01


class PriorKind(Enum):
    """How the prior is formed from the simple rule it leans on (one of BASE_RULES)."""

    RULE = "rule"                 # the rule itself
    SCALED_RULE = "scaled rule"   # the rule times one factor fitted to the training rows
    RIDGE = "ridge"               # coefficients fitted with a ridge toward the rule


@dataclass(frozen=True)
class PriorForm:
    """A prior candidate of the inner cross-validation: its kind and, for ``RIDGE``, the
    ridge's strength (> 0)."""

    kind: PriorKind
    ridge: float = 0.0

    def __post_init__(self) -> None:
        if (self.kind is PriorKind.RIDGE) != (math.isfinite(self.ridge) and self.ridge > 0.0):
            raise ValueError(f"ridge strength {self.ridge!r} for a {self.kind.value} prior")

    def to_file(self) -> float | None:
        """The selection's ``ridge`` in a model file: null for the rule itself, -1 for the
        scaled rule, else the strength. The encoding earlier iadeep versions wrote (a float
        sentinel), kept so a model file reads the same in either version."""
        if self.kind is PriorKind.RULE:
            return None
        return _SCALED_RULE_IN_FILE if self.kind is PriorKind.SCALED_RULE else self.ridge

    @classmethod
    def from_file(cls, value: float | None) -> PriorForm:
        """The inverse of ``to_file``; ValueError (or TypeError) for anything else."""
        if value is None:
            return RULE_ITSELF
        if isinstance(value, bool):   # JSON true/false is no strength
            raise ValueError(f"ridge strength {value!r}")
        strength = float(value)
        if strength == _SCALED_RULE_IN_FILE:
            return SCALED_RULE
        return cls(PriorKind.RIDGE, strength)


_SCALED_RULE_IN_FILE = -1.0
RULE_ITSELF = PriorForm(PriorKind.RULE)
# The base rule times one factor fitted to the training rows (their mean absolute error, over
# SCALE_GRID). One free parameter, so it can be fitted with fewer workloads than
# MIN_PRIOR_WORKLOADS; preferred after the rule itself and before every fitted prior by the
# one-standard-error rule.
SCALED_RULE = PriorForm(PriorKind.SCALED_RULE)
SCALE_GRID = np.round(np.arange(0.5, 2.0001, 0.01), 2)

# Candidates for the inner cross-validation: the simple rule the prior leans on (BASE_RULES),
# the ridge strength toward it (with MIN_PRIOR_WORKLOADS or more workloads; below that the prior
# is that rule, or SCALED_RULE) and the correction's amplitude.
PRIOR_RIDGE_GRID: tuple[float, ...] = (3.0, 0.3, 0.03)
# Whether the inner cross-validation considers SCALED_RULE (``fit_model(rule_scale=...)``):
# nested leave-one-family-out on lucid-part chose it in 4 of 5 outer folds (0.0662 -> 0.0647,
# benchmarks/nested_eval.py); on the H200 data the rule itself is kept (the same model).
RULE_SCALE = True
# Whether the one-standard-error rule takes the scaled rule as the simplest prior (before the
# rule itself: it is one parameter more, but the rule's scale of 1 is a guess too): see
# docs/scheduling.md "How fast a new workload is learnt" for what nested cross-validation
# said of it (``fit_model(scaled_first=...)``).
SCALED_FIRST = False
GP_AMPLITUDE_GRID: tuple[float, ...] = (0.0, 0.01, GP_AMPLITUDE)
# The scale the correction works on: "log speed" (the default: it multiplies the prior's
# speed, ``prior x exp(correction)``) or "speed" (it is added to it; every model file written
# before the log scale, which has no ``correction`` entry, reads as this). Speeds are ratios of
# throughputs: on the log scale a residual the correction learns is a relative change of the
# prior's speed (x0.8 rather than -0.15), and a prediction stays positive. Nested
# leave-one-workload-out on the H200 data chooses it in all seven outer folds (0.0469 ->
# 0.0438); on lucid-part's families the fits select no correction, so the scale does not
# matter there (benchmarks/nested_eval.py); lucid-part leave-one-workload-out 0.0639 -> 0.0612.
CORRECTION_SCALES = ("speed", "log speed")
LOG_CORRECTION = True
INNER_FOLDS = 8         # at most this many inner folds (groups are dealt round-robin)
# The prior has six coefficients: fitting them needs measurements of at least this many
# workloads (two per coefficient); with fewer the prior stays the chosen rule (or that rule
# times one fitted factor, SCALED_RULE) and only the (local) correction learns. With the
# seven H200 workloads a fitted prior extrapolates badly to a kind of job it has not seen
# (mlp, the one launch-bound workload, held out: 0.27 vs 0.08).
MIN_PRIOR_WORKLOADS = 12
# A workload's own offset (a random effect, shrunk by empirical Bayes) needs the spread between
# workloads told apart from the noise: with fewer measured workloads than this there are none.
# With the seven H200 workloads (six in a leave-one-workload-out fold) offsets made the
# held-out error worse (0.0469 -> 0.056-0.062): six means are too few to estimate that spread.
MIN_OFFSET_WORKLOADS = MIN_PRIOR_WORKLOADS
# How much of the workloads' own offsets (their empirical-Bayes estimates) the model keeps,
# candidates for the inner cross-validation, the first preferred when the held-out errors
# cannot tell them apart (the one-standard-error rule). The default keeps them whole: letting
# the inner cross-validation choose among (1, 0.5, 0) picks 1 in every fold of
# leave-one-family-out on lucid-part (benchmarks/nested_eval.py).
OFFSET_SCALE_GRID: tuple[float, ...] = (1.0,)

# The correction is a sparse GP: at most this many inducing points (distinct (self, partner)
# feature rows; a seeded subset beyond that), so a fit costs O(rows x MAX_INDUCING^2) and a
# prediction O(MAX_INDUCING), however many pairs a lab has measured.
MAX_INDUCING = 150
# The prior is fitted with a robust loss (soft L1 beyond this residual, in speed units): the
# score is the mean absolute error, and single measurements above 1.0 or far off are common.
ROBUST_SCALE = 0.02

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
# The utilisation-sum rule 1 / max(1, u_s + u_o) in these terms: the over-subscription alone.
UTIL_SUM_THETA = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
# The simple rules a prior may lean on (inner cross-validation picks the one that does best).
BASE_RULES = {"analytic": ANALYTIC_THETA, "utilisation sum": UTIL_SUM_THETA}
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


def corrected(prior: np.ndarray, correction: np.ndarray, log_correction: bool) -> np.ndarray:
    """The prior's speeds with the correction applied on its scale (CORRECTION_SCALES)."""
    return prior * np.exp(correction) if log_correction else prior + correction


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
        xs, zs = x / self.length_scales, self.x_train / self.length_scales
        sq = (xs * xs).sum(1)[:, None] + (zs * zs).sum(1)[None, :] - 2.0 * xs @ zs.T
        return self.amplitude * np.exp(-0.5 * np.maximum(sq, 0.0))

    def mean(self, x: np.ndarray) -> np.ndarray:
        """Residual mean for rows x (``correct`` without the confidence)."""
        return self._kernel(x) @ self.alpha

    def correct(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Residual mean and a 0..1 confidence (1 - posterior std / prior std) for rows x."""
        k = self._kernel(x)
        mean = k @ self.alpha
        var = self.amplitude - ((k @ self.k_inv) * k).sum(axis=1)
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


# Calibration: quantiles of |held-out error| / widen(confidence) at these levels (interpolated
# in between).
CAL_LEVELS = (*(round(0.05 * i, 2) for i in range(1, 20)), 0.975, 0.99)
# An interval's width grows as the correction's confidence falls (a pair far from every
# measured one): half-width = calibrated quantile x widen(confidence). The inner
# cross-validation scores the held-out errors the same way (normalised split-conformal), so the
# coverage holds on average and moves from near pairs to far ones.
WIDEN = 1.0


def widen(confidence: np.ndarray | float) -> np.ndarray:
    """Interval scale for a prediction of this 0..1 confidence (1 at full confidence)."""
    return 1.0 + WIDEN * (1.0 - np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0))


def _analytic_calibration() -> tuple[float, ...]:
    # No data: a wide interval, proportional to the level (+- ANALYTIC_HALF_WIDTH_80 at 0.8,
    # after widen() of the analytic confidence).
    scale = float(widen(ANALYTIC_CONFIDENCE))
    return tuple(min(1.0, ANALYTIC_HALF_WIDTH_80 * lv / 0.8) / scale for lv in CAL_LEVELS)


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


def model_dict(gpu_model: str, gps: Sequence[ResidualGP], note: str, trained_on: Sequence[str],
               theta: np.ndarray, calibration: Sequence[float],
               observed: Mapping[tuple[str, str], tuple[float, float]], fitted: bool,
               offsets: Mapping[str, float] | None = None,
               selection: Mapping | None = None, log_correction: bool = False) -> dict:
    """A model as plain numbers (the saved JSON; ``InterferenceModel.from_dict`` reads it).
    ``offsets`` (workload -> its own speed offset) and ``correction`` (its scale, one of
    CORRECTION_SCALES) are optional in the file: a model saved without them predicts as
    before (no offsets, the correction added to the speed)."""
    return {"format": MODEL_FORMAT, "version": MODEL_VERSION, "gpu_model": gpu_model,
            "prior_terms": list(PRIOR_TERMS), "theta": np.asarray(theta, float).tolist(),
            "fitted": fitted, "note": note, "trained_on": list(trained_on),
            "calibration_levels": list(CAL_LEVELS), "calibration": list(calibration),
            "observed": [[a, b, t, n] for (a, b), (t, n) in sorted(observed.items())],
            "gps": [g.to_dict() for g in gps],
            "correction": CORRECTION_SCALES[int(log_correction)],
            "offsets": {w: float(v) for w, v in sorted((offsets or {}).items())},
            **({"selection": dict(selection)} if selection else {})}

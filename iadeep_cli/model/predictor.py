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
  makes a job faster. The analytic estimate ``1 / (1 + 1.1 u_partner)`` and the
  utilisation-sum rule ``1 / max(1, u_s + u_o)`` are both special cases; the coefficients are
  shrunk toward the one that does better alone on held-out training groups, so with thin data
  the prior *is* that rule, and with many measured pairs of a GPU model it is that GPU's physics.
* Correction: a sparse Gaussian process (at most MAX_INDUCING inducing points, strongly
  regularised kernel) on the residual measured - prior, on utilisation (and power / GPM
  metrics when both profiles have them). Far from the measured workloads the kernel decays, the
  prediction returns to the prior, and the interval widens (``widen``).
* The rule, the ridge and the correction's amplitude are chosen by grouped cross-validation
  *inside the training data* (workload families held out when the names carry them, else
  workloads) with the one-standard-error rule, never by looking at held-out data. The same
  inner cross-validation's out-of-group residuals calibrate the intervals (normalised
  split-conformal): ``predict_interval(a, b, 0.8)`` covers the measured speed of an unseen
  workload about 80 % of the time.
* The lab's own observations win: a pair that has been measured is predicted as the precision-
  weighted mean of the model's estimate (its variance from the calibration, or the squared
  disagreement with the measurements if that is larger) and the mean of the measurements (noise
  std ``OBS_NOISE``), so after one or two observations the prediction follows them, and its
  interval narrows with every further one.
* ``predict(a, b)`` is one function ``f(self, partner)`` evaluated both ways, so swapping the pair
  swaps the answer exactly.
* The fitted model is stored as plain arrays in JSON and predicts with numpy only (fitting, in
  ``fit``, uses scipy): ``iadeep model predict`` and the scheduler must not pay for importing
  scipy. ``terms`` holds what prediction and fitting share.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist

import numpy as np

from ..errors import InputError, ModelError
from ..paths import replace_file
from ..profiles import CoLocation, Profile
from .terms import (
    ANALYTIC_CONFIDENCE,
    ANALYTIC_THETA,
    CAL_LEVELS,
    CORRECTION_SCALES,
    LOG_CORRECTION,
    MAX_SPEED,
    MIN_SPEED,
    MODEL_FORMAT,
    MODEL_VERSION,
    OBS_NOISE,
    OFFSET_SCALE_GRID,
    PRIOR_TERMS,
    RULE_SCALE,
    SCALED_FIRST,
    ResidualGP,
    _analytic_calibration,
    corrected,
    job_features,
    model_dict,
    prior_speed,
    prior_terms,
    widen,
)


@dataclass(frozen=True)
class PairPrediction:
    speed_a: float
    speed_b: float
    confidence: float   # 0..1
    method: str         # "model" | "analytic" | "observed"


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
    # a trained workload's own speed offset (how much faster or slower it runs next to any
    # partner than the prior and correction say), shrunk toward 0; 0 for a workload not seen
    offsets: dict[str, float] = field(default_factory=dict)
    # the correction multiplies the prior's speed (``exp``, its "log speed" scale) instead of
    # being added to it (terms.CORRECTION_SCALES; a model file without the entry: added)
    log_correction: bool = False
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
        """The calibrated half-width at ``level`` for a pair of confidence 1 (multiply by
        ``widen(confidence)``)."""
        if not 0.0 < level < 1.0:
            raise InputError(f"interval level {level} must be between 0 and 1",
                             hint="e.g. 0.8 for an 80% interval")
        return float(np.interp(level, (0.0, *CAL_LEVELS), (0.0, *self.calibration)))

    def _structural(self, a: Profile, b: Profile) -> tuple[np.ndarray, np.ndarray, str]:
        """Speeds (a, b) from prior + correction, confidence per speed, method (no
        observations)."""
        prior = prior_speed(self.theta, np.vstack([prior_terms(a, b), prior_terms(b, a)]))
        own = np.array([self.offsets.get(a.workload, 0.0), self.offsets.get(b.workload, 0.0)])
        gp, fa, fb = self._choose(a, b)
        if gp is None:
            return (prior + own, np.full(2, ANALYTIC_CONFIDENCE),
                    "model" if self.fitted else "analytic")
        x = np.vstack([np.concatenate([fa, fb]), np.concatenate([fb, fa])])
        resid, conf = gp.correct(x)
        return corrected(prior, resid, self.log_correction) + own, conf, "model"

    def _predict_uncached(self, a: Profile, b: Profile) -> tuple[PairPrediction, np.ndarray]:
        """The prediction and, per speed, the interval's scale: for a pair not measured, the
        multiple of the calibrated half-width (``widen(confidence)``); for a measured one,
        minus the posterior std of the precision-weighted mean (a negative number)."""
        s, confs, method = self._structural(a, b)
        conf = float(confs.min())
        scale = widen(confs)                       # far from measured pairs: wider
        base_sigma = self._half_width(0.6827)      # ~1 std of the model's held-out error
        for i, key in enumerate(((a.workload, b.workload), (b.workload, a.workload))):
            hit = self.observed.get(key)
            sigma = base_sigma * scale[i]
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
            scale[i] = -np.sqrt(1.0 / (prec_model + prec_obs))
            method = "observed"
            conf = max(conf, float(1.0 - np.sqrt(1.0 - w)))
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
        a pair the lab has measured: normal around the measurements' weighted mean)."""
        p, scale = self._lookup(a, b)
        z = NormalDist().inv_cdf(0.5 + level / 2.0) if 0.0 < level < 1.0 else 0.0
        half = np.where(scale >= 0, self._half_width(level) * scale, -scale * z)
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
        return model_dict(self.gpu_model, self.gps, self.note, self.trained_on, self.theta,
                          self.calibration, self.observed, self.fitted, self.offsets,
                          log_correction=self.log_correction)

    def save(self, path) -> None:
        p = Path(path)
        try:
            replace_file(p, json.dumps(self.to_dict()))
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
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data, path="model") -> InterferenceModel:
        """The model from its plain numbers (``to_dict``); ``path`` names it in errors."""
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
            if dict(data.get("partner_offsets") or {}):
                # an earlier iadeep could fit each workload's offset as the partner (an option,
                # off by default, since removed): such a model predicts otherwise without them
                raise ModelError(f"{path}: model has partner offsets, which this iadeep no "
                                 "longer supports",
                                 hint="refit it with this iadeep: `iadeep model fit -o FILE`")
            gps = tuple(ResidualGP.from_dict(g) for g in data["gps"])
            scale = data.get("correction", CORRECTION_SCALES[0])
            if scale not in CORRECTION_SCALES:
                raise ValueError(f"correction scale {scale!r} is none of "
                                 f"{', '.join(CORRECTION_SCALES)}")
            observed = {(str(a), str(b)): (float(t), float(n)) for a, b, t, n in data["observed"]}
            return cls(str(data.get("gpu_model", "")), gps, str(data.get("note", "")),
                       tuple(data.get("trained_on", ())), np.asarray(data["theta"], float),
                       tuple(float(c) for c in data["calibration"]), observed,
                       bool(data["fitted"]),
                       {str(w): float(v) for w, v in dict(data.get("offsets") or {}).items()},
                       CORRECTION_SCALES.index(scale) == 1)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{path}: corrupt model file ({type(exc).__name__}: {exc})",
                             hint="refit it with `iadeep model fit -o FILE`") from None


# ---------------------------------------------------------------------------------------------
# Fitting lives in .fit (it imports scipy); these wrappers keep the import of
# this module numpy-only.
# ---------------------------------------------------------------------------------------------
def fit_model(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
              gpu_model: str | None = None, *,
              extra_profiles: Mapping[str, Profile] | None = None,
              extra_observations: Sequence[CoLocation] | None = None,
              groups: Mapping[str, str] | None = None,
              offset_scales: Sequence[float] | None = None,
              rule_scale: bool | None = None,
              log_correction: bool | None = None,
              scaled_first: bool | None = None) -> InterferenceModel:
    """Fit on pair measurements of one GPU model (see ``model.fit.fit_parameters``;
    ``offset_scales`` default: ``terms.OFFSET_SCALE_GRID``, ``rule_scale``:
    ``terms.RULE_SCALE``, ``log_correction``: ``terms.LOG_CORRECTION``)."""
    from .fit import fit_parameters

    return InterferenceModel.from_dict(fit_parameters(
        profiles, observations, gpu_model, extra_profiles=extra_profiles,
        extra_observations=extra_observations, groups=groups,
        offset_scales=OFFSET_SCALE_GRID if offset_scales is None else tuple(offset_scales),
        rule_scale=RULE_SCALE if rule_scale is None else rule_scale,
        log_correction=LOG_CORRECTION if log_correction is None else log_correction,
        scaled_first=SCALED_FIRST if scaled_first is None else scaled_first),
        "fitted model")


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


"""Fitting the interference model: scipy lives here, so predicting (``predictor``) stays
numpy-only. The result is the model as plain numbers (``terms.model_dict``), which
``predictor.InterferenceModel.from_dict`` reads, in this process or after a child process
wrote it (the controller's refit).

Scaling: repeated measurements of the same (self, partner) are averaged into one row weighted
by their samples; every row's prior terms and correction features are computed once, as arrays,
and the inner cross-validation works on index subsets of them. The correction is a sparse GP
(at most ``MAX_INDUCING`` inducing points, the DTC approximation; exact when there are fewer
distinct rows), so a fit grows linearly in the number of distinct pairs.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..profiles import MAX_MEASURED_SPEED, CoLocation, Profile, measurable
from .terms import (
    ANALYTIC_CONFIDENCE,
    ANALYTIC_THETA,
    BASE_RULES,
    CAL_LEVELS,
    CORRECTION_SCALES,
    FEATURE_SETS,
    GP_AMPLITUDE,
    GP_AMPLITUDE_GRID,
    GP_NOISE,
    INNER_FOLDS,
    LOG_CORRECTION,
    MAX_INDUCING,
    MAX_SPEED,
    MIN_OFFSET_WORKLOADS,
    MIN_PAIRS,
    MIN_PRIOR_WORKLOADS,
    MIN_SPEED,
    OFFSET_SCALE_GRID,
    PRIOR_LOWER,
    PRIOR_RIDGE_GRID,
    ROBUST_SCALE,
    RULE_ITSELF,
    RULE_SCALE,
    SCALE_GRID,
    SCALED_FIRST,
    SCALED_RULE,
    PriorForm,
    PriorKind,
    ResidualGP,
    _analytic_calibration,
    corrected,
    job_features,
    merge_measurements,
    model_dict,
    prior_speed,
    prior_terms,
    widen,
)


@dataclass(frozen=True)
class _Row:
    s: Profile          # the job whose speed this is
    o: Profile          # its partner
    y: float            # measured speed (mean of the measurements)
    n: int              # samples


def _directed_rows(profiles: Mapping[str, Profile], observations: Sequence[CoLocation]
                   ) -> list[_Row]:
    """One row per (self, partner) whose workloads we know: the samples-weighted mean speed of
    every measurement of it (repeats aggregated)."""
    acc: dict[tuple[str, str], list[float]] = {}
    for o in observations:
        if len(o.jobs) != 2 or not all(j in profiles for j in o.jobs):
            continue
        for (s, p), y in zip((o.jobs, o.jobs[::-1]), o.speeds):
            if not measurable((y,)):
                raise InputError(f"measured speed {y} for {s} next to {p} is outside "
                                 f"(0, {MAX_MEASURED_SPEED:g}]",
                                 hint="speed = co-located / solo throughput")
            a = acc.setdefault((s, p), [0.0, 0.0])
            a[0] += y * o.samples
            a[1] += o.samples
    return [_Row(profiles[s], profiles[p], total / n, int(n))
            for (s, p), (total, n) in acc.items()]


class _Data:
    """The rows as arrays: prior terms, speeds, samples, correction features per feature set;
    ``log_correction``: the correction's scale (``terms.CORRECTION_SCALES``)."""

    def __init__(self, rows: Sequence[_Row], log_correction: bool = LOG_CORRECTION):
        self.rows = list(rows)
        self.log_correction = log_correction
        self.terms = (np.vstack([prior_terms(r.s, r.o) for r in rows]) if rows
                      else np.zeros((0, 6)))
        self.y = np.array([r.y for r in rows], dtype=float)
        self.n = np.array([r.n for r in rows], dtype=float)
        self.self_names = [r.s.workload for r in rows]
        self.partner_names = [r.o.workload for r in rows]
        self.workloads = sorted(set(self.self_names))
        code = {w: i for i, w in enumerate(self.workloads)}
        self.self_codes = np.array([code[w] for w in self.self_names], dtype=int)
        self.feats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, feats, _ls in FEATURE_SETS:
            x, ok = [], []
            for r in rows:
                fa, fb = job_features(r.s, feats), job_features(r.o, feats)
                ok.append(fa is not None and fb is not None)
                x.append(np.concatenate([fa, fb]) if fa is not None and fb is not None
                         else np.zeros(2 * len(feats)))
            self.feats[name] = (np.array(ok, dtype=bool),
                                np.vstack(x) if x else np.zeros((0, 2 * len(feats))))


def _fit_prior_arrays(terms: np.ndarray, y: np.ndarray, n: np.ndarray, prior: PriorForm,
                      base: np.ndarray) -> np.ndarray:
    """The prior's coefficients of kind ``prior``: ``base`` itself; ``base`` times the factor
    (SCALE_GRID) of least weighted MAE; or robust least squares in speed, coefficients >=
    PRIOR_LOWER, with a ridge of strength ``prior.ridge`` toward ``base``."""
    if prior.kind is PriorKind.RULE or not len(y):
        return base.copy()
    if prior.kind is PriorKind.SCALED_RULE:
        z = terms @ base
        speeds = 1.0 / (1.0 + np.maximum(SCALE_GRID[:, None] * z[None, :], -0.5))
        loss = (np.abs(speeds - y[None, :]) * n[None, :]).sum(axis=1)
        return float(SCALE_GRID[int(np.argmin(loss))]) * base
    from scipy.optimize import least_squares  # type: ignore[import-untyped]

    w = np.sqrt(n)
    pen = np.sqrt(prior.ridge)
    eye = pen * np.eye(len(base))

    def resid(theta: np.ndarray) -> np.ndarray:
        return np.concatenate([w * (prior_speed(theta, terms) - y), pen * (theta - base)])

    def jac(theta: np.ndarray) -> np.ndarray:
        z = terms @ theta
        d = np.where(z > -0.5, -1.0 / (1.0 + np.maximum(z, -0.5)) ** 2, 0.0)
        return np.vstack([(w * d)[:, None] * terms, eye])

    start = np.maximum(base, PRIOR_LOWER)
    return np.asarray(least_squares(resid, start, jac=jac, bounds=(PRIOR_LOWER, np.inf),
                                    loss="soft_l1", f_scale=ROBUST_SCALE).x, float)


def _fit_prior(rows: Sequence[_Row], prior: PriorForm,
               base: np.ndarray = ANALYTIC_THETA) -> np.ndarray:
    d = _Data(rows)
    return _fit_prior_arrays(d.terms, d.y, d.n, prior, base)


def _rbf(x: np.ndarray, z: np.ndarray, scales: np.ndarray, amplitude: float) -> np.ndarray:
    xs, zs = x / scales, z / scales
    sq = (xs * xs).sum(1)[:, None] + (zs * zs).sum(1)[None, :] - 2.0 * xs @ zs.T
    return amplitude * np.exp(-0.5 * np.maximum(sq, 0.0))


def _fit_gp(name: str, feats: tuple[str, ...], ls: tuple[float, ...], x: np.ndarray,
            resid: np.ndarray, n: np.ndarray, amplitude: float) -> ResidualGP:
    """Sparse GP (DTC) on the residuals: inducing points are the distinct rows, a seeded subset
    of MAX_INDUCING of them when there are more. Exactly the full GP when every row is one."""
    scales = np.array(ls + ls, dtype=float)
    z = np.unique(x, axis=0)
    if len(z) > MAX_INDUCING:
        z = z[np.sort(np.random.default_rng(0).choice(len(z), MAX_INDUCING, replace=False))]
    noise = GP_NOISE / np.maximum(n, 1.0)
    kmm = _rbf(z, z, scales, amplitude) + 1e-8 * amplitude * np.eye(len(z))
    kmn = _rbf(z, x, scales, amplitude)
    a = kmm + (kmn / noise) @ kmn.T
    sigma = np.linalg.inv(a)
    alpha = sigma @ (kmn @ (resid / noise))
    # posterior variance amplitude - k (Kmm^-1 - Sigma) k; stored where the full GP has K^-1
    k_inv = np.linalg.inv(kmm) - sigma
    return ResidualGP(name, feats, scales, z, alpha, k_inv, amplitude)


Offsets = np.ndarray | None     # by workload code (_Data.workloads); None: no offsets


def _self_offsets(codes: np.ndarray, resid: np.ndarray, n_codes: int) -> np.ndarray:
    """Each workload's own offset (indexed by code; 0 for one without rows): the mean residual
    of the rows where it is the job measured, shrunk toward 0 as a random effect (empirical
    Bayes, one-way analysis of variance: the between-workload variance of the means against
    the within-workload variance). Rows are the unit, not samples: repeats of one pair are one
    partner's worth of evidence. No knob to tune: with no spread between workloads beyond the
    within-workload noise every offset is 0, and a workload measured next to few partners
    keeps little of its mean."""
    zero = np.zeros(n_codes)
    counts = np.bincount(codes, minlength=n_codes).astype(float)
    seen = counts > 0
    dof = float(counts.sum() - seen.sum())
    if seen.sum() < 2 or dof <= 0:
        return zero
    means = np.bincount(codes, weights=resid, minlength=n_codes) / np.maximum(counts, 1.0)
    within = float(((resid - means[codes]) ** 2).sum()) / dof
    between = float(np.mean(means[seen] ** 2) - np.mean(within / counts[seen]))
    if between <= 0:
        return zero
    return np.where(seen, counts * between / (counts * between + within) * means, 0.0)


def _offset_array(d: _Data, idx: np.ndarray, offsets: np.ndarray | None) -> np.ndarray:
    return np.zeros(len(idx)) if offsets is None else offsets[d.self_codes[idx]]


def _fit_structure(d: _Data, idx: np.ndarray, base: np.ndarray, prior: PriorForm,
                   amplitude: float, offset_scale: float = 1.0
                   ) -> tuple[np.ndarray, Offsets, tuple[ResidualGP, ...]]:
    theta = _fit_prior_arrays(d.terms[idx], d.y[idx], d.n[idx], prior, base)
    offsets, gps = _fit_correction(d, idx, theta, amplitude)
    return theta, _scaled(offsets, offset_scale), gps


def _scaled(offsets: Offsets, scale: float) -> Offsets:
    return None if offsets is None or scale == 0.0 else offsets * scale


def _fit_correction(d: _Data, idx: np.ndarray, theta: np.ndarray, amplitude: float
                    ) -> tuple[Offsets, tuple[ResidualGP, ...]]:
    """The GP on the prior's residuals, then (with MIN_OFFSET_WORKLOADS or more workloads
    measured) each workload's own offset on what is left. The GP models how a pair's
    utilisations interact; the offset what a known workload does next to any partner that
    no function of utilisation says (Lucid's VGG runs 0.07-0.15 faster than its utilisation
    predicts, next to everything). A workload not seen in training gets no offset.
    Offsets after the GP, not before: fitted first they absorb the part of the residual that
    depends on the partners a workload happened to be measured with (leave-one-family-out on
    lucid-part: 0.0671 before, 0.0662 after). The GP learns the residual on the correction's
    scale (``d.log_correction``: log measured - log prior); the offsets are in speed.
    On the log scale a measured speed below MIN_SPEED counts as MIN_SPEED (the model predicts
    nothing below it): one all but stalled measurement (0.0001, log residual -8.5) would
    otherwise outweigh every other row, and made the fit drop the correction altogether."""
    prior = prior_speed(theta, d.terms)
    resid = (np.log(np.maximum(d.y, MIN_SPEED)) - np.log(prior) if d.log_correction
             else d.y - prior)
    gps = []
    for name, feats, ls in FEATURE_SETS if amplitude > 0 else ():
        ok, x = d.feats[name]
        use = idx[ok[idx]]
        pairs = {frozenset((d.self_names[i], d.partner_names[i])) for i in use}
        if len(pairs) >= MIN_PAIRS:
            gps.append(_fit_gp(name, feats, ls, x[use], resid[use], d.n[use], amplitude))
    codes = d.self_codes[idx]
    if len(np.unique(codes)) < MIN_OFFSET_WORKLOADS:
        return None, tuple(gps)
    pred, _ = _predict_idx(d, idx, theta, None, gps, confidence=False)
    return _self_offsets(codes, d.y[idx] - pred, len(d.workloads)), tuple(gps)


def _predict_idx(d: _Data, idx: np.ndarray, theta: np.ndarray, offsets: Offsets,
                 gps: Sequence[ResidualGP], confidence: bool = True
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Structural speeds (clipped) and confidences of rows ``idx``: the same numbers as
    ``InterferenceModel.predict_pair``, batched (``confidence=False``: speeds only, the
    confidences left at ANALYTIC_CONFIDENCE)."""
    correction = np.zeros(len(idx))
    conf = np.full(len(idx), ANALYTIC_CONFIDENCE)
    todo = np.ones(len(idx), dtype=bool)
    for gp in gps:
        ok, x = d.feats[gp.name]
        use = todo & ok[idx]
        if use.any():
            if confidence:
                mean, conf[use] = gp.correct(x[idx[use]])
            else:
                mean = gp.mean(x[idx[use]])
            correction[use] += mean
        todo &= ~use
    out = (corrected(prior_speed(theta, d.terms[idx]), correction, d.log_correction)
           + _offset_array(d, idx, offsets))
    return np.clip(out, MIN_SPEED, MAX_SPEED), conf


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


# (base rule, how the prior is formed from it, GP amplitude, share of the workloads' own
# offsets kept)
Setting = tuple[str, PriorForm, float, float]


def _inner_cv(d: _Data, groups: Mapping[str, str],
              scales: Sequence[float] = OFFSET_SCALE_GRID, rule_scale: bool = RULE_SCALE,
              scaled_first: bool = SCALED_FIRST
              ) -> tuple[Setting, np.ndarray, np.ndarray, np.ndarray]:
    """Choose (base rule, prior form, GP amplitude, offset scale among ``scales``) by grouped
    cross-validation on the training rows; return it and its held-out |errors|, confidences
    and weights (for the intervals)."""
    sg = [groups.get(w, w) for w in d.self_names]
    og = [groups.get(w, w) for w in d.partner_names]
    names = sorted(set(sg) | set(og))
    fold_of = {g: i % INNER_FOLDS for i, g in enumerate(names)}
    n_folds = min(INNER_FOLDS, len(names))
    fs, fo = np.array([fold_of[g] for g in sg]), np.array([fold_of[g] for g in og])
    many = len(set(d.self_names)) >= MIN_PRIOR_WORKLOADS
    rules = (RULE_ITSELF, *((SCALED_RULE,) if rule_scale else ()))
    priors: tuple[PriorForm, ...] = (
        *(rules[::-1] if scaled_first else rules),
        *(PriorForm(PriorKind.RIDGE, r) for r in (PRIOR_RIDGE_GRID if many else ())))
    errors: dict[Setting, list[np.ndarray]] = defaultdict(list)
    confs: dict[Setting, list[np.ndarray]] = defaultdict(list)
    rule_errors: dict[str, list[float]] = defaultdict(list)   # each simple rule alone
    # with too few workloads to fit a prior, too few to choose a rule by either: the analytic
    # one (the H200 data without mlp, its one launch-bound job, favours the utilisation sum,
    # which then misses mlp by 0.23)
    considered = BASE_RULES if many else {"analytic": BASE_RULES["analytic"]}
    for k in range(n_folds):
        held = (fs == k) | (fo == k)
        train, test = np.flatnonzero(~held), np.flatnonzero(held)
        if not len(train) or not len(test):
            continue
        for base_name, base in considered.items():
            rule = np.clip(prior_speed(base, d.terms[test]), MIN_SPEED, MAX_SPEED)
            rule_errors[base_name] += np.abs(rule - d.y[test]).tolist()
            for prior in priors:
                theta = _fit_prior_arrays(d.terms[train], d.y[train], d.n[train], prior, base)
                for amp in GP_AMPLITUDE_GRID:
                    offsets, gps = _fit_correction(d, train, theta, amp)
                    for scale in scales:
                        pred, conf = _predict_idx(d, test, theta, _scaled(offsets, scale), gps)
                        errors[(base_name, prior, amp, scale)].append(np.abs(pred - d.y[test]))
                        confs[(base_name, prior, amp, scale)].append(conf)
    if not errors:
        return (("analytic", RULE_ITSELF, GP_AMPLITUDE, scales[0]), np.array([]),
                np.array([]), np.array([]))
    # the simple rule that does best on the held-out groups comes first
    bases = sorted(considered, key=lambda b: float(np.mean(rule_errors[b])))
    best = _one_standard_error(errors, bases, list(priors), list(scales))
    # each held-out fold weighs the same in the calibration: the unit that is new to a model
    # is a group, and a group of many easy pairs must not make every interval narrow
    weights = np.concatenate([np.full(len(e), 1.0 / len(e)) for e in errors[best]])
    return best, np.concatenate(errors[best]), np.concatenate(confs[best]), weights


def _one_standard_error(errors: Mapping[Setting, list[np.ndarray]], bases: list[str],
                        priors: list[PriorForm], scales: list[float]) -> Setting:
    """The one-standard-error rule: among the settings whose inner-fold MAE is within one
    standard error (paired over folds) of the best one, the most regularised: the first base
    rule (``bases``: the rule that does best alone first), then the prior form first in
    ``priors`` (the rule itself, the scaled rule, then the strongest ridge), then the smallest
    correction, then the offset scale first in ``scales``.
    With a handful of groups the best
    setting often wins by noise (seven H200 workloads: holding out mlp picked the utilisation
    sum rule by 0.002, and mlp, the one launch-bound job, is exactly what it gets wrong)."""
    def mae(c: Setting) -> float:
        return float(np.mean(np.concatenate(errors[c])))

    best = min(errors, key=mae)
    fold_best = np.array([float(e.mean()) for e in errors[best]])
    close = []
    for c, errs in errors.items():
        diff = np.array([float(e.mean()) for e in errs]) - fold_best
        se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
        if mae(c) - mae(best) <= se:
            close.append(c)
    return min(close, key=lambda c: (bases.index(c[0]), priors.index(c[1]), c[2],
                                     scales.index(c[3]), mae(c)))


def _calibration(abs_errors: np.ndarray, confs: np.ndarray, weights: np.ndarray | None = None
                 ) -> tuple[float, ...]:
    """Normalised conformal quantiles (|error| / widen(confidence)) at CAL_LEVELS, each error
    weighted (default equally; finite-sample corrected)."""
    n = len(abs_errors)
    if n < 10:
        return _analytic_calibration()
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    order = np.argsort(abs_errors / widen(confs))
    srt = (abs_errors / widen(confs))[order]
    cum = np.cumsum(w[order]) / w.sum()
    out = []
    for lv in CAL_LEVELS:
        target = min(1.0, lv * (n + 1) / n)        # the split-conformal correction
        out.append(float(srt[min(n - 1, int(np.searchsorted(cum, target - 1e-12)))]))
    return tuple(out)


def _observed_pairs(rows: Sequence[_Row]) -> dict[tuple[str, str], tuple[float, float]]:
    return {(r.s.workload, r.o.workload): (r.y * r.n, float(r.n)) for r in rows}


def _one_blas_thread() -> AbstractContextManager:
    """The fit's matrices are small (at most MAX_INDUCING square): a multi-threaded BLAS only
    spins its threads against each other, and on a busy 2-core machine made a 150 x 150
    inverse take 0.1 s instead of 1 ms (a lucid-part fit 25-35 s instead of 3 s).
    threadpoolctl is a declared dependency; without it the fit runs with the BLAS's default."""
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:
        return nullcontext()
    return threadpool_limits(1)


def fit_parameters(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
                   gpu_model: str | None = None, *,
                   extra_profiles: Mapping[str, Profile] | None = None,
                   extra_observations: Sequence[CoLocation] | None = None,
                   groups: Mapping[str, str] | None = None,
                   previous: Mapping | None = None,
                   offset_scales: Sequence[float] = OFFSET_SCALE_GRID,
                   rule_scale: bool = RULE_SCALE,
                   log_correction: bool = LOG_CORRECTION,
                   scaled_first: bool = SCALED_FIRST) -> dict:
    """The model as plain numbers (see ``_fit_parameters``), fitted with one BLAS thread."""
    with _one_blas_thread():
        return _fit_parameters(profiles, observations, gpu_model, extra_profiles=extra_profiles,
                               extra_observations=extra_observations, groups=groups,
                               previous=previous, offset_scales=offset_scales,
                               rule_scale=rule_scale, log_correction=log_correction,
                               scaled_first=scaled_first)


# An incremental refit reuses the previous fit's selected setting and calibration while the
# distinct (self, partner) rows have grown by at most this share since that selection: the
# controller adds a few observations at a time, and the selection (about 200 fits) is what a
# refit costs, the final fit with the chosen setting one of them.
RESELECT_GROWTH = 0.1


def _reusable(previous: Mapping | None, gpu: str, n_rows: int, n_workloads: int,
              scales: Sequence[float], rule_scale: bool = RULE_SCALE,
              log_correction: bool = LOG_CORRECTION
              ) -> tuple[Setting, tuple[float, ...], int, int] | None:
    """The previous fit's (setting, calibration, rows and workloads at its selection) when
    still valid here."""
    sel = (previous or {}).get("selection")
    if not isinstance(sel, Mapping) or not previous or previous.get("gpu_model") != gpu:
        return None
    try:
        setting: Setting = (str(sel["base"]), PriorForm.from_file(sel["ridge"]),
                            float(sel["amplitude"]),
                            float(sel.get("offset_scale", 1.0)))
        rows, workloads = int(sel["rows"]), int(sel["workloads"])
        calibration = tuple(float(c) for c in previous["calibration"])
        levels = tuple(previous["calibration_levels"])
    except (KeyError, TypeError, ValueError):
        return None
    if (setting[0] not in BASE_RULES or levels != CAL_LEVELS
            or setting[3] not in scales
            # a setting (and calibration) selected for the correction on another scale
            or previous.get("correction", CORRECTION_SCALES[0])
            != CORRECTION_SCALES[int(log_correction)]
            or (setting[1].kind is PriorKind.SCALED_RULE and not rule_scale)
            or not rows <= n_rows <= rows * (1.0 + RESELECT_GROWTH)
            # the candidates differ on either side of these (prior fitted or not, offsets)
            or (workloads >= MIN_PRIOR_WORKLOADS) != (n_workloads >= MIN_PRIOR_WORKLOADS)
            or (workloads >= MIN_OFFSET_WORKLOADS) != (n_workloads >= MIN_OFFSET_WORKLOADS)):
        return None
    return setting, calibration, rows, workloads


def _fit_parameters(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
                    gpu_model: str | None = None, *,
                    extra_profiles: Mapping[str, Profile] | None = None,
                    extra_observations: Sequence[CoLocation] | None = None,
                    groups: Mapping[str, str] | None = None,
                    previous: Mapping | None = None,
                    offset_scales: Sequence[float] = OFFSET_SCALE_GRID,
                    rule_scale: bool = RULE_SCALE,
                    log_correction: bool = LOG_CORRECTION,
                    scaled_first: bool = SCALED_FIRST) -> dict:
    """Fit on pair measurements of one GPU model (triples are not used for fitting).

    ``extra_*`` (the lab's own measurements) override the given ones per gpu_model+workload.
    ``groups`` (workload -> group) are the units the inner cross-validation holds out
    (default: ``default_groups``). With fewer than MIN_PAIRS distinct measured pairs the result
    is the analytic model, and its ``note`` says so. ``previous`` (an earlier result of this
    function, e.g. the controller's last refit): its setting and calibration are reused while
    the data grew by at most RESELECT_GROWTH since they were selected (incremental refit).
    ``offset_scales``: the shares of the workloads' own offsets the inner cross-validation
    chooses among (the first preferred on a tie; ``(0.0,)``: no offsets). ``rule_scale``: the
    inner cross-validation also considers the base rule times one fitted factor (SCALED_RULE).
    ``log_correction``: the correction's scale (``terms.LOG_CORRECTION``). ``scaled_first``:
    the one-standard-error rule takes the scaled rule as simpler than the rule itself.
    """
    if not offset_scales or any(not 0.0 <= s <= 1.0 for s in offset_scales):
        raise InputError(f"offset scales {tuple(offset_scales)} must be one or more numbers "
                         "in [0, 1]", hint="e.g. (1.0, 0.5, 0.0)")
    profiles, observations = merge_measurements(profiles, observations, extra_profiles,
                                                extra_observations)
    gpu = gpu_model if gpu_model is not None else _majority_gpu(profiles)
    profiles = {k: p for k, p in profiles.items() if not gpu or p.gpu_model in ("", gpu)}
    observations = [o for o in observations if not gpu or o.gpu_model in ("", gpu)]
    rows = _directed_rows(profiles, observations)
    trained = tuple(sorted({r.s.workload for r in rows}))
    n_pairs = len({frozenset((r.s.workload, r.o.workload)) for r in rows})
    if n_pairs < MIN_PAIRS:
        note = (f"analytic fallback: only {n_pairs} distinct measured pairs for "
                f"{gpu or 'this GPU'} (need {MIN_PAIRS})")
        return model_dict(gpu, (), note, trained, ANALYTIC_THETA, _analytic_calibration(),
                          _observed_pairs(rows), fitted=False)
    d = _Data(rows, log_correction)
    grouping = dict(groups) if groups is not None else default_groups(trained)
    reuse = _reusable(previous, gpu, len(rows), len(trained), offset_scales, rule_scale,
                      log_correction)
    if reuse is not None:
        (base_name, prior, amp, scale), calibration, selected_rows, selected_workloads = reuse
    else:
        (base_name, prior, amp, scale), held_out, held_conf, held_w = _inner_cv(
            d, grouping, offset_scales, rule_scale, scaled_first)
        calibration = _calibration(held_out, held_conf, held_w)
        selected_rows, selected_workloads = len(rows), len(trained)
    theta, offsets, gps = _fit_structure(d, np.arange(len(rows)), BASE_RULES[base_name],
                                         prior, amp, scale)
    rule = BASE_RULES[base_name]
    described = (
        f"prior: the {base_name} rule" if prior.kind is PriorKind.RULE
        else f"prior: the {base_name} rule x{theta @ rule / (rule @ rule):.2f}"
        if prior.kind is PriorKind.SCALED_RULE
        else f"prior fitted toward the {base_name} rule (ridge {prior.ridge:g})")
    note = (f"fitted on {n_pairs} distinct pairs of {len(trained)} workloads "
            f"({gpu or 'unknown GPU'}); {described}; correction: "
            f"{', '.join(g.name for g in gps) or 'none'}"
            f"{f' (amplitude {amp:g}, on {CORRECTION_SCALES[int(log_correction)]})' if gps else ''}"
            f"{f'; own offsets x{scale:g}' if offsets is not None else ''}"
            f"{f'; setting selected on {selected_rows} rows' if reuse is not None else ''}")
    selection = {"base": base_name, "ridge": prior.to_file(), "amplitude": amp,
                 "offset_scale": scale,
                 "rows": selected_rows, "workloads": selected_workloads}
    own: dict[str, float] = ({w: float(v) for w, v in zip(d.workloads, offsets) if v != 0.0}
                             if offsets is not None else {})
    return model_dict(gpu, gps, note, trained, theta, calibration, _observed_pairs(rows),
                      fitted=True, offsets=own, selection=selection,
                      log_correction=log_correction)

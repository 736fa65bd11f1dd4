"""Held-out evaluation: the honest test of "predicts workloads (and families) never seen".

Two protocols, both per GPU model (a model is fitted for one GPU model; mixing GPUs in a fold
would test something the scheduler never does):

* leave-one-workload-out (LOWO): for every workload W, hold out every pair measurement involving
  W (its self-pair included), fit on the rest, predict the held-out pairs.
* leave-one-family-out (LOFO): the same with a whole family (``ResNet18-bs32-amp0`` and
  ``ResNet18-bs64-amp1`` are one family, ``ResNet18``) held out at once, so batch-size and
  precision variants of the held-out model cannot leak into training. Reported when the
  workloads carry families (a ``family`` column, or names ``family-...``) and there are at least
  three families, one of them with two or more members.

The score is the mean absolute error over all held-out speeds (both speeds of each pair). The
baselines are scored on the same folds: the *constant* (mean training speed), the analytic prior
``1 / (1 + 1.1 u_partner)``, and the utilisation-sum estimate ``1 / max(1, u_a + u_b)``. The
model's interval (``predict_interval`` at ``level``) is scored by its coverage: the share of
held-out speeds inside it; ``fit_s`` is the mean wall time of one fold's fit.
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import InputError
from ..profiles import CoLocation, Profile
from .data import family_of
from .predictor import InterferenceModel, fit_model
from .terms import analytic_speed, util_sum_speed

LOWO = "leave-one-workload-out"
LOFO = "leave-one-family-out"
DEFAULT_LEVEL = 0.8


@dataclass(frozen=True)
class EvalResult:
    n_predictions: int
    n_workloads: int
    mae_model: float
    mae_mean_baseline: float
    mae_util_sum_baseline: float
    mae_analytic_prior: float
    per_workload: dict  # held-out group (workload or family) -> model MAE on its held-out pairs
    protocol: str = LOWO
    gpu_model: str = ""
    n_groups: int = 0             # folds: workloads (LOWO) or families (LOFO)
    interval_level: float = DEFAULT_LEVEL
    coverage: float = float("nan")        # share of held-out speeds inside the interval
    mean_interval_width: float = float("nan")
    fit_s: float = float("nan")           # mean wall time of one fold's fit (seconds)

    def to_dict(self) -> dict:
        return asdict(self)


Fitter = Callable[[Mapping[str, Profile], Sequence[CoLocation]], InterferenceModel]


def _pairs_of(profiles: Mapping[str, Profile], observations: Sequence[CoLocation]
              ) -> list[CoLocation]:
    return [o for o in observations if len(o.jobs) == 2 and all(j in profiles for j in o.jobs)]


@dataclass(frozen=True)
class _Fold:
    group: str                       # a workload, or a family of them
    train: list[CoLocation]          # every pair touching none of them
    test: list[CoLocation]           # every pair touching one of them


def _held_out(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
              groups: Mapping[str, str], fit: Fitter | None, what: str
              ) -> tuple[list[str], list[_Fold], Fitter]:
    """What a held-out protocol needs: the workloads with pairs, one fold per group (a
    workload, or its family in ``groups``) in name order, and the fit (default ``fit_model``,
    whose inner cross-validation holds out the same unit). ``what`` names the protocol in the
    error for fewer than 3 workloads."""
    inner = {w: groups.get(w, w) for w in profiles}
    pairs = _pairs_of(profiles, observations)
    workloads = sorted({j for o in pairs for j in o.jobs})
    if len(workloads) < 3:
        raise InputError(f"{what} needs pairs of at least 3 workloads, got "
                         f"{len(workloads)}", hint="give a pairs file with more workloads")
    folds = []
    for g in sorted({groups.get(w, w) for w in workloads}):
        members = frozenset(w for w in workloads if groups.get(w, w) == g)
        folds.append(_Fold(g, [o for o in pairs if not members & set(o.jobs)],
                           [o for o in pairs if members & set(o.jobs)]))
    return workloads, folds, fit or (lambda p, o: fit_model(p, o, groups=inner))


def cross_validate(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
                   groups: Mapping[str, str], *, protocol: str = LOWO,
                   level: float = DEFAULT_LEVEL, fit: Fitter | None = None) -> EvalResult:
    """Hold out each group (every pair touching one of its workloads), fit on the rest with
    ``fit`` (default ``fit_model``), score the held-out speeds. ``groups``: workload -> group.

    The default fit's inner cross-validation (which chooses the model's setting) holds out the
    same unit as this protocol: single workloads for leave-one-workload-out, the given groups
    (families) for leave-one-family-out. Selection then mimics the question being scored: a
    setting chosen on held-out families is needlessly blind to a new workload's measured
    siblings, and one chosen on held-out workloads overrates what siblings teach about a new
    family."""
    workloads, folds, fit = _held_out(profiles, observations, groups, fit, protocol)
    errs: dict[str, list[float]] = defaultdict(list)
    covered: list[bool] = []
    widths: list[float] = []
    per: dict[str, float] = {}
    fit_times: list[float] = []
    for held in folds:
        train, test = held.train, held.test
        t0 = time.perf_counter()
        model = fit(profiles, train)
        fit_times.append(time.perf_counter() - t0)
        mean_speed = float(np.mean([s for o in train for s in o.speeds])) if train else 0.5
        fold = []
        for o in test:
            a, b = (profiles[j] for j in o.jobs)
            pred = model.predict_pair(a, b)
            lo, hi = model.predict_interval(a, b, level)
            ua, ub = a.gpu_util / 100.0, b.gpu_util / 100.0
            for got, y, prior, us, lo_i, hi_i in (
                    (pred.speed_a, o.speeds[0], analytic_speed(ub), util_sum_speed(ua, ub),
                     lo[0], hi[0]),
                    (pred.speed_b, o.speeds[1], analytic_speed(ua), util_sum_speed(ub, ua),
                     lo[1], hi[1])):
                errs["model"].append(abs(got - y))
                errs["mean"].append(abs(mean_speed - y))
                errs["sum"].append(abs(us - y))
                errs["prior"].append(abs(float(prior) - y))
                covered.append(lo_i <= y <= hi_i)
                widths.append(hi_i - lo_i)
                fold.append(abs(got - y))
        per[held.group] = float(np.mean(fold))
    gpus = sorted({profiles[w].gpu_model for w in workloads})
    return EvalResult(len(errs["model"]), len(workloads), float(np.mean(errs["model"])),
                      float(np.mean(errs["mean"])), float(np.mean(errs["sum"])),
                      float(np.mean(errs["prior"])), per, protocol, ", ".join(gpus),
                      len(folds), level, float(np.mean(covered)), float(np.mean(widths)),
                      float(np.mean(fit_times)))


# A candidate model: given the inner cross-validation's groups, its fit.
Variant = Callable[[Mapping[str, str]], Fitter]


@dataclass(frozen=True)
class NestedResult:
    outer: EvalResult             # the held-out scores of the chosen variants
    chosen: dict                  # outer held-out group -> the variant its inner CV chose
    inner_mae: dict               # outer held-out group -> {variant: inner held-out MAE}


def nested_cross_validate(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
                          groups: Mapping[str, str], variants: Mapping[str, Variant], *,
                          protocol: str = LOWO, level: float = DEFAULT_LEVEL) -> NestedResult:
    """Choose among ``variants`` (name -> fit factory) inside every outer fold, by the same
    protocol run on that fold's training pairs only, and score the chosen variant on the
    held-out group: the outer error is then an honest estimate of the whole procedure,
    choice included (a variant picked by looking at the outer scores themselves is not).
    The first variant wins ties (list the default first). With one variant this is
    ``cross_validate`` with that fit."""
    if not variants:
        raise InputError("no model variants to choose among", hint="give at least one")
    chosen: dict[str, str] = {}
    inner_mae: dict[str, dict[str, float]] = {}
    names = list(variants)

    def choose(p: Mapping[str, Profile], train: Sequence[CoLocation]) -> InterferenceModel:
        held = sorted({groups.get(w, w) for w in p} - {groups.get(j, j) for o in train
                                                        for j in o.jobs})
        key = ", ".join(held) or "?"
        pick = names[0]
        if len(names) > 1:
            scores = {n: cross_validate(p, train, groups, protocol=protocol, level=level,
                                        fit=variants[n]({w: groups.get(w, w) for w in p})
                                        ).mae_model for n in names}
            inner_mae[key] = scores
            pick = min(names, key=lambda n: (scores[n], names.index(n)))
        chosen[key] = pick
        return variants[pick]({w: groups.get(w, w) for w in p})(p, train)

    outer = cross_validate(profiles, observations, groups, protocol=protocol, level=level,
                           fit=choose)
    return NestedResult(outer, chosen, inner_mae)


def lowo_evaluate(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
                  *, level: float = DEFAULT_LEVEL, fit: Fitter | None = None) -> EvalResult:
    """Leave-one-workload-out over all the given profiles and pairs."""
    return cross_validate(profiles, observations, {}, protocol=LOWO, level=level, fit=fit)


def families_usable(families: Mapping[str, str], workloads: Sequence[str]) -> bool:
    """True when holding out families differs from holding out workloads and leaves data:
    three or more families, at least one with two or more members."""
    groups = defaultdict(set)
    for w in workloads:
        groups[families.get(w, family_of(w))].add(w)
    return len(groups) >= 3 and any(len(m) > 1 for m in groups.values())


def evaluate_all(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
                 families: Mapping[str, str] | None = None, *, level: float = DEFAULT_LEVEL,
                 fit: Fitter | None = None) -> list[EvalResult]:
    """LOWO and, where families are usable, LOFO, for every GPU model that has pairs of at
    least three workloads. ``families``: workload -> family (default: from the names)."""
    out: list[EvalResult] = []
    by_gpu: dict[str, list[CoLocation]] = defaultdict(list)
    for o in _pairs_of(profiles, observations):
        gpus = {profiles[j].gpu_model for j in o.jobs}
        if len(gpus) == 1 and (o.gpu_model in ("", *gpus)):
            by_gpu[gpus.pop()].append(o)
    for gpu in sorted(by_gpu):
        profs = {k: p for k, p in profiles.items() if p.gpu_model == gpu}
        obs = by_gpu[gpu]
        workloads = sorted({j for o in obs for j in o.jobs})
        if len(workloads) < 3:
            continue
        out.append(lowo_evaluate(profs, obs, level=level, fit=fit))
        fams = {w: (families or {}).get(w) or family_of(w) for w in workloads}
        if families_usable(fams, workloads):
            out.append(cross_validate(profs, obs, fams, protocol=LOFO, level=level, fit=fit))
    if not out:
        raise InputError("no GPU model has pair measurements of at least 3 profiled workloads",
                         hint="check the pairs file against the profiles file (gpu_model "
                         "and workload names)")
    return out


def triple_composition_error(model, profiles: Mapping[str, Profile],
                             triples: Sequence[CoLocation]) -> float:
    """MAE of ``model.predict_group`` against measured 3-job groups (all speeds)."""
    errs = []
    for t in triples:
        if all(j in profiles for j in t.jobs):
            pred = model.predict_group([profiles[j] for j in t.jobs])
            errs += [abs(p - y) for p, y in zip(pred, t.speeds)]
    if not errs:
        raise InputError("no triple whose workloads are all profiled",
                         hint="check the triples file against the profiles file")
    return float(np.mean(errs))


@dataclass(frozen=True)
class CurvePoint:
    """The held-out error on a new workload (or family) after its first ``k`` observed pairs."""

    k: int
    mae_model: float
    mae_util_sum: float       # the utilisation-sum rule on the same held-out speeds
    n_predictions: int
    n_groups: int             # held-out groups with enough pairs for every k asked

    def to_dict(self) -> dict:
        return asdict(self)


def learning_curve(profiles: Mapping[str, Profile], observations: Sequence[CoLocation],
                   groups: Mapping[str, str], ks: Sequence[int] = (0, 1, 3, 10), *,
                   draws: int = 5, seed: int = 0, fit: Fitter | None = None
                   ) -> list[CurvePoint]:
    """How fast a new workload's error falls as its first pairs are observed.

    For every group (a workload, or a family with ``groups``) hold out every pair touching it,
    as ``cross_validate`` does; then, ``draws`` times, shuffle its pairs: the first ``k`` are
    "observed" (added to the training pairs, as the controller's refit adds a lab's
    measurements) and the pairs after the largest ``k`` are scored, the same ones for every
    ``k`` of a draw. A ``k`` larger than a group's pairs allow (at least one left to score) is
    skipped for that group; ``n_groups`` says how many groups each point rests on."""
    import random

    _, folds, fit = _held_out(profiles, observations, groups, fit, "a learning curve")
    if not ks or any(k < 0 for k in ks) or draws < 1:
        raise InputError("observed pairs must be >= 0 and draws >= 1",
                         hint="e.g. ks 0,1,3,10 and 5 draws")
    ks = sorted(set(ks))
    rng = random.Random(f"learning-curve:{seed}")
    errs: dict[int, list[float]] = defaultdict(list)
    base: dict[int, list[float]] = defaultdict(list)
    used: dict[int, set[str]] = defaultdict(set)
    for held in folds:
        train, mine = held.train, held.test
        fits = [k for k in ks if k < len(mine)]
        if not fits:
            continue
        for _ in range(draws):
            order = rng.sample(mine, len(mine))
            test = order[max(fits):]
            for k in fits:
                model = fit(profiles, train + order[:k])
                for o in test:
                    a, b = (profiles[j] for j in o.jobs)
                    pred = model.predict_pair(a, b)
                    ua, ub = a.gpu_util / 100.0, b.gpu_util / 100.0
                    for got, y, us in ((pred.speed_a, o.speeds[0], util_sum_speed(ua, ub)),
                                       (pred.speed_b, o.speeds[1], util_sum_speed(ub, ua))):
                        errs[k].append(abs(got - y))
                        base[k].append(abs(us - y))
                used[k].add(held.group)
    return [CurvePoint(k, float(np.mean(errs[k])), float(np.mean(base[k])), len(errs[k]),
                       len(used[k])) for k in ks if errs[k]]

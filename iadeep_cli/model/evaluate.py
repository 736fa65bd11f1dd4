"""Leave-one-workload-out (LOWO) evaluation: the honest test of "predicts workloads never seen".

For every workload W: hold out every pair measurement involving W (its self-pair included), fit
on the rest, predict the held-out pairs. The score is the mean absolute error over all held-out
predictions (both speeds of each pair). Two baselines are scored on the same folds: the mean
training speed, and the utilisation-sum estimate ``1 / max(1, u_a + u_b)``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import InputError
from ..profiles import CoLocation, Profile
from .predictor import analytic_speed, fit_model, util_sum_speed


@dataclass(frozen=True)
class EvalResult:
    n_predictions: int
    n_workloads: int
    mae_model: float
    mae_mean_baseline: float
    mae_util_sum_baseline: float
    mae_analytic_prior: float
    per_workload: dict  # workload -> model MAE on its held-out pairs

    def to_dict(self) -> dict:
        return asdict(self)


def lowo_evaluate(profiles: Mapping[str, Profile], observations: Sequence[CoLocation]
                  ) -> EvalResult:
    pairs = [o for o in observations if len(o.jobs) == 2 and all(j in profiles for j in o.jobs)]
    workloads = sorted({j for o in pairs for j in o.jobs})
    if len(workloads) < 3:
        raise InputError(f"leave-one-workload-out needs pairs of at least 3 workloads, got "
                         f"{len(workloads)}", hint="give a pairs file with more workloads")
    errs: dict[str, list[float]] = {"model": [], "mean": [], "sum": [], "prior": []}
    per: dict[str, float] = {}
    for w in workloads:
        train = [o for o in pairs if w not in o.jobs]
        test = [o for o in pairs if w in o.jobs]
        model = fit_model(profiles, train)
        mean_speed = float(np.mean([s for o in train for s in o.speeds])) if train else 0.5
        fold = []
        for o in test:
            a, b = (profiles[j] for j in o.jobs)
            pred = model.predict_pair(a, b)
            ua, ub = a.gpu_util / 100.0, b.gpu_util / 100.0
            for got, y, prior, us in ((pred.speed_a, o.speeds[0], analytic_speed(ub),
                                       util_sum_speed(ua, ub)),
                                      (pred.speed_b, o.speeds[1], analytic_speed(ua),
                                       util_sum_speed(ub, ua))):
                errs["model"].append(abs(got - y))
                errs["mean"].append(abs(mean_speed - y))
                errs["sum"].append(abs(us - y))
                errs["prior"].append(abs(float(prior) - y))
                fold.append(abs(got - y))
        per[w] = float(np.mean(fold))
    return EvalResult(len(errs["model"]), len(workloads), float(np.mean(errs["model"])),
                      float(np.mean(errs["mean"])), float(np.mean(errs["sum"])),
                      float(np.mean(errs["prior"])), per)


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

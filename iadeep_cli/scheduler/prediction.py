"""What ``placement.plan()`` asks of an interference model (``Predictor``), and the wrappers
it is used through: ``CachedModel`` (memoised answers, within and across rounds) and
``CautiousModel`` (share less where the model is unsure). Pure, like plan().
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..profiles import Profile

# How plan() asks for a group's speeds (a Predictor's predict_group, possibly memoised): the
# profiles of the jobs sharing one GPU -> each one's predicted speed, in the same order.
Predict = Callable[[list[Profile]], Sequence[float]]


class Predictor(Protocol):
    """What ``plan`` needs of an interference model: ``model.predictor.InterferenceModel``,
    the simulator's ``TruthModel`` (the oracle), or a ``CachedModel`` around either."""

    def predict_group(self, profiles: Sequence[Profile]) -> Sequence[float]:
        """Each job's speed (relative to running alone) when the jobs with these profiles
        share one GPU, in the same order."""


class CachedModel:
    """Memoises ``predict_group`` by workload names: a round asks the same question many times.

    Keyed on the workload labels, so it must only wrap a model whose answer depends on the
    profiles alone (every model we ship). The simulator keeps one across rounds.
    """

    def __init__(self, model: Predictor):
        self.model = model
        self._cache: dict[tuple[str, ...], tuple[float, ...]] = {}

    def predict_group(self, profiles: Sequence[Profile]) -> tuple[float, ...]:
        key = tuple(p.workload for p in profiles)
        hit = self._cache.get(key)
        if hit is None:
            hit = tuple(float(s) for s in self.model.predict_group(list(profiles)))
            self._cache[key] = hit
        return hit


# Share less where the predictor is unsure (CautiousModel): predicted speeds are lowered toward
# the lower end of their CAUTION_LEVEL interval by CAUTION_WEIGHT of the distance.
CAUTION_LEVEL = 0.8
CAUTION_WEIGHT = 0.5


class CautiousModel:
    """Share less where the predictor is unsure: each predicted speed is moved toward the lower
    end of its ``CAUTION_LEVEL`` interval by ``CAUTION_WEIGHT`` of the distance (the largest
    such gap over the job's partners). A measured pair has a narrow interval and is left almost
    unchanged; a pair of workloads the model has not seen together is taken as slower, so plan()
    shares it only when even the cautious estimate pays. A model without ``predict_interval``
    (the truth) passes through. Wraps the model; plan() is unchanged."""

    def __init__(self, model: Predictor, level: float = CAUTION_LEVEL,
                 weight: float = CAUTION_WEIGHT):
        self.model = model
        self.level = level
        self.weight = weight
        self.note = getattr(model, "note", "")

    def predict_group(self, profiles: Sequence[Profile]) -> tuple[float, ...]:
        speeds = tuple(float(s) for s in self.model.predict_group(list(profiles)))
        interval = getattr(self.model, "predict_interval", None)
        if interval is None or self.weight <= 0 or len(profiles) < 2:
            return speeds
        out = []
        for i, s in enumerate(speeds):
            gap = 0.0
            for j, other in enumerate(profiles):
                if j == i:
                    continue
                (lo, _), _ = interval(profiles[i], other, self.level)
                mid = self.model.predict_group([profiles[i], other])[0]
                gap = max(gap, float(mid) - lo)
            out.append(max(0.0, s - self.weight * gap))
        return tuple(out)

"""Mixed GPU models: how fast each workload runs on each model, and which model a job prefers.

Pure arithmetic, no I/O: the controller and the simulator build a ``ModelSpeeds`` once per
round from the profiles they hold (one per workload *and* GPU model: a profile records the
model it was measured on and, when known, its solo throughput ``solo_it_per_s``) and pass it to
``PlanInputs.speeds``. A cluster with one GPU model never needs it: ``plan()`` then decides
exactly as it always did.

**A job's speed on a model** (``ModelSpeeds.factor``) is its solo throughput there relative to
the *reference* model (the model with the most measured workloads; ties: the first the
caller names):

1. measured on both models: the ratio of the two measured solo throughputs;
2. measured on one model only: that measurement carried over with the *lab-wide ratio* of the
   two models, the geometric mean of solo[w, m] / solo[w, ref] over every workload w the lab
   measured on both (a geometric mean, so one odd workload moves it little and the ratios
   compose: a -> b -> c equals a -> c);
3. measured nowhere (a new workload): the lab-wide ratio itself;
4. no workload measured on both models: the models count as equally fast (1.0), and the
   explanation says so.

**Which model a job prefers** (``preference``), Gavel's idea (Narayanan et al., OSDI'20:
allocate by throughput normalised across the job's alternatives) reduced to one greedy round:

- while nobody waits behind it (more empty GPUs than jobs behind), the model where *it* is
  fastest: nobody else is denied anything;
- under pressure, the model where its *comparative advantage* is largest: its factor there
  divided by the geometric mean factor of the round's queue on that model (geometric, so the
  choice does not depend on which model is the reference). A job that loses little on
  the slower model (a launch-bound one) takes it and leaves the faster model to a job that
  gains most there, which is what maximises the lab's total normalised throughput.
  Only among the models where the job keeps at least ``KEEP`` (0.8) of its best speed: Gavel
  re-allocates every round, but a placement here is final (no migration), so a job sent to a
  model where it runs at 0.5x pays for it for its whole run. Measured in the simulator (10
  seeds, h200:8,a100:8, docs/simulator.md 'Mixed GPU models'): without the bound the comparative
  advantage lost to always taking the fastest model (0.805 vs 0.788 at load 0.9); with it,
  it is level with it.

It never waits for a faster model that is full: when its preferred model has no room it tries
the next (a job running at 0.6x now finishes before one that waits hours for a faster GPU in a
busy lab). The explanation of a factor (``why``) goes into ``queue why``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..profiles import Profile, gpu_model_key


@dataclass(frozen=True)
class ModelSpeeds:
    """Solo speed of each workload on each GPU model, relative to ``reference``."""

    reference: str
    models: tuple[str, ...]
    measured: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (w, m) -> it/s
    ratios: Mapping[str, float] = field(default_factory=dict)   # m -> lab-wide ratio to ref
    basis: Mapping[str, int] = field(default_factory=dict)      # m -> workloads behind it

    def factor(self, workload: str | None, model: str) -> float:
        """``workload``'s solo speed on ``model`` relative to the reference model."""
        return self._factor(workload, model)[0]

    def why(self, workload: str | None, model: str) -> str:
        """How ``factor`` was obtained, for a person: 'measured on both', 'estimated ...'."""
        how = self._factor(workload, model)[1]
        if how == "reference":
            return "the reference model"
        if how == "equal":
            return f"no workload measured on both {model} and {self.reference}: taken as equal"
        if how == "measured":
            return f"measured on both {model} and {self.reference}"
        n = self.basis.get(model, 0)
        return (f"estimated from the {n} workload{'s' if n != 1 else ''} the lab measured on "
                f"both {model} and {self.reference}")

    def _factor(self, workload: str | None, model: str) -> tuple[float, str]:
        """The factor and how it was obtained: "reference", "equal" (nothing measured on both
        models), "measured" (this workload on both) or "estimated" (the lab-wide ratio).
        ``factor`` is asked per job and model each round: no text is made here."""
        if model == self.reference:
            return 1.0, "reference"
        ratio = self.ratios.get(model)
        if ratio is None:
            return 1.0, "equal"
        here = self.measured.get((workload, model)) if workload else None
        ref = self.measured.get((workload, self.reference)) if workload else None
        if here and ref:
            return here / ref, "measured"
        # measured on one model (or on none): the lab-wide ratio carries it over
        return ratio, "estimated"


def model_speeds(profiles: Iterable[Profile], models: Iterable[str]) -> ModelSpeeds:
    """Build the round's table from every profile the caller holds (each with its
    ``gpu_model``; those without ``solo_it_per_s`` only say nothing) for the GPU model keys
    present in the round (``models``). See the module docstring for the rules."""
    keys = list(dict.fromkeys(m for m in models if m))
    measured: dict[tuple[str, str], float] = {}
    for p in profiles:
        m = gpu_model_key(p.gpu_model)
        if m and p.solo_it_per_s and p.solo_it_per_s > 0 and math.isfinite(p.solo_it_per_s):
            measured[(p.workload, m)] = float(p.solo_it_per_s)
    count = {m: sum(1 for (_, mm) in measured if mm == m) for m in keys}
    reference = max(keys, key=lambda m: (count[m], -keys.index(m))) if keys else ""
    ratios: dict[str, float] = {}
    basis: dict[str, int] = {}
    for m in keys:
        if m == reference:
            continue
        logs = [math.log(measured[(w, m)] / x) for (w, mm), x in measured.items()
                if mm == reference and (w, m) in measured]
        if logs:
            ratios[m] = math.exp(sum(logs) / len(logs))
            basis[m] = len(logs)
    return ModelSpeeds(reference, tuple(keys), measured, ratios, basis)


def queue_means(speeds: ModelSpeeds, workloads: Sequence[str | None]) -> dict[str, float]:
    """Geometric mean factor of the round's queue on each model (the denominator of the
    comparative advantage); computed once per round, each distinct workload once per model."""
    count: dict[str | None, int] = {}
    for w in workloads:
        count[w] = count.get(w, 0) + 1
    n = sum(count.values())
    out: dict[str, float] = {}
    for m in speeds.models:
        if not n:
            out[m] = 1.0
            continue
        out[m] = math.exp(sum(k * math.log(speeds.factor(w, m)) for w, k in count.items()) / n)
    return out


KEEP = 0.8   # under pressure, only models where a job keeps this much of its best speed


def preference(speeds: ModelSpeeds, workload: str | None, available: Iterable[str],
               pressure: bool, means: Mapping[str, float]) -> list[str]:
    """The models to try for one job, best first (see the module docstring): under pressure
    those where it keeps ``KEEP`` of its best speed by comparative advantage, then the rest
    fastest first; else fastest first. Ties keep the faster model first, then the name."""
    models = sorted(set(available))
    factor = {m: speeds.factor(workload, m) for m in models}

    def fastest(m: str) -> tuple[float, str]:
        return (-factor[m], m)
    if not pressure or not models:
        return sorted(models, key=fastest)
    best = max(factor.values())
    near = [m for m in models if factor[m] >= KEEP * best]

    def advantage(m: str) -> tuple[float, float, str]:
        adv = factor[m] / means[m] if means.get(m) else factor[m]
        return (-round(adv, 9), -factor[m], m)
    first = sorted(near, key=advantage)
    return first + sorted((m for m in models if m not in near), key=fastest)

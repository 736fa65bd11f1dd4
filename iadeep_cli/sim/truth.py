"""Ground truth for the simulator: measured co-location speeds, looked up, never predicted.

Groups of two use the measured pair; groups of three use a measured triple when there is one
(in any order). Larger or unmeasured groups use the composition rule the predictor also uses,
applied to *measured* pairs: slowdowns add, ``1/speed_i = 1 + sum_j (1/s_ij - 1)``. On the
shipped H200 data it reproduces the measured triples of busy jobs within 0.03 (lstm next to
vgg16 and ncf: rule 0.367, measured 0.352) but overrates the launch-bound mlp in a triple by up
to 0.11 (0.387 vs 0.292 next to resnet18 and vgg16). Only max_jobs_per_gpu >= 3 reaches it.

The same object serves as the 'oracle' policy's model: plan() with the true speeds.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import InputError
from ..profiles import CoLocation, Profile


class TruthModel:
    """``predict_group`` from measurements; raises InputError when a needed pair is missing."""

    def __init__(self, pairs: Iterable[CoLocation], triples: Iterable[CoLocation] = ()):
        self.pairs: dict[tuple[str, str], float] = {}     # (me, partner) -> my speed
        self.groups: dict[tuple[str, ...], dict[str, list[float]]] = {}
        for obs in pairs:
            a, b = obs.jobs
            self.pairs[(a, b)], self.pairs[(b, a)] = obs.speeds[0], obs.speeds[1]
            if a == b:   # a self-pair: both copies ran at about the same speed
                self.pairs[(a, a)] = (obs.speeds[0] + obs.speeds[1]) / 2.0
        sums: dict[tuple[str, ...], dict[str, list[list[float]]]] = {}
        for obs in triples:   # the same set measured twice (in any order) is averaged
            per = sums.setdefault(tuple(sorted(obs.jobs)), {})
            seen: dict[str, int] = {}
            for name, speed in zip(obs.jobs, obs.speeds):
                k = seen.get(name, 0)
                seen[name] = k + 1
                slots = per.setdefault(name, [])
                if len(slots) <= k:
                    slots.append([])
                slots[k].append(speed)
        self.groups = {key: {n: [sum(v) / len(v) for v in vs] for n, vs in per.items()}
                       for key, per in sums.items()}

    def workloads(self) -> set[str]:
        return {a for a, _ in self.pairs}

    def missing_pairs(self, names: Iterable[str]) -> list[tuple[str, str]]:
        """Pairs among ``names`` (self-pairs included) that were never measured."""
        ns = sorted(set(names))
        return [(a, b) for i, a in enumerate(ns) for b in ns[i:] if (a, b) not in self.pairs]

    def pair_speed(self, me: str, partner: str) -> float:
        try:
            return self.pairs[(me, partner)]
        except KeyError:
            raise InputError(f"no measured speed for {me} next to {partner} in the truth data",
                             hint="add that pair to --truth PAIRS.csv") from None

    def speeds(self, names: Sequence[str]) -> tuple[float, ...]:
        n = len(names)
        if n <= 1:
            return (1.0,) * n
        if n == 2:
            return (self.pair_speed(names[0], names[1]), self.pair_speed(names[1], names[0]))
        measured = self.groups.get(tuple(sorted(names)))
        if measured is not None:
            used: dict[str, int] = {}
            out = []
            for name in names:
                k = used.get(name, 0)
                out.append(measured[name][k % len(measured[name])])
                used[name] = k + 1
            return tuple(out)
        extra = [sum(1.0 / self.pair_speed(names[i], names[j]) - 1.0
                     for j in range(n) if j != i) for i in range(n)]
        return tuple(1.0 / (1.0 + e) for e in extra)

    def predict_group(self, profiles: Sequence[Profile]) -> tuple[float, ...]:
        return self.speeds([p.workload for p in profiles])

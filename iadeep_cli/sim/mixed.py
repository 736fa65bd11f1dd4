"""A mixed cluster in the simulator: ``--gpus h200:8,a100:8``, and the second model's truth.

The shipped measurements are H200 only. A GPU model with no measurement gets a *derived*
truth (docs/simulator.md, 'Mixed GPU models'; derived, not measured):

* **Solo speed** relative to the H200, from the workload's H200 profile. A job's time is
  ``(1 - u)`` outside kernels (host work, launches: the same on any GPU) plus ``u`` in kernels,
  ``u`` = gpu_util / 100. Of the kernel time a share ``beta = min(1, mem_util / gpu_util)`` is
  bound by memory bandwidth, the rest by compute. On the other model the two parts take
  ``1 / BANDWIDTH`` and ``1 / COMPUTE`` times as long:
  ``factor = 1 / ((1 - u) + u * (beta / BANDWIDTH + (1 - beta) / COMPUTE))``. A100 (80 GB SXM)
  against H200: BANDWIDTH 0.42 (2.0 vs 4.8 TB/s, the data sheets), COMPUTE 0.5 (training
  throughput of an H100, whose compute the H200 shares, is about twice an A100's in MLPerf
  Training). The shipped workloads come out between 0.46 (resnet50) and 0.90 (mlp, which is
  launch-bound).
* **Pairs**: the H200 pair's slowdown ``1/s - 1`` times the partner's busy-fraction growth
  ``u'/u`` (``u' = u x kernel time / total time`` on the slower model): a partner whose kernels
  take longer holds the GPU for a larger share of the time, so it hurts more. Groups of three or
  more compose the derived pairs (``1/s_i = 1 + sum_j (1/s_ij - 1)``), as the truth does
  without a measured triple.

The engine multiplies a job's interference speed by its solo factor on its GPU's model; work is
counted in H200-seconds (a job's duration is its solo time on an H200).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..errors import InputError
from ..profiles import Profile, gpu_model_key
from ..scheduler.gpumodels import ModelSpeeds, model_speeds
from .truth import TruthModel

REFERENCE = "h200"          # the model the shipped measurements are of
# Derived models: (compute ratio, memory-bandwidth ratio, GPU memory in MiB) against the H200.
DERIVED = {"a100": (0.5, 0.42, 81920.0)}
MEMORY_MIB = {"h200": 143771.0, **{m: v[2] for m, v in DERIVED.items()}}
KNOWN = (REFERENCE, *DERIVED)


def parse_gpus(text: str) -> tuple[int, tuple[tuple[str, int], ...]]:
    """``8`` -> (8, ()); ``h200:8,a100:8`` -> (16, (("h200", 8), ("a100", 8))). One line,
    naming what is wrong, for anything else."""
    raw = text.strip()
    hint = "e.g. --gpus 8 or --gpus h200:8,a100:8"
    if raw.isdigit():
        n = int(raw)
        if n < 1:
            raise InputError(f"--gpus must be >= 1, got {raw}", hint=hint)
        return n, ()
    layout: list[tuple[str, int]] = []
    for part in raw.split(","):
        model, sep, count = part.strip().partition(":")
        key = gpu_model_key(model)
        if not sep or not key:
            raise InputError(f"--gpus {text!r}: expected a number or MODEL:COUNT,...", hint=hint)
        if not count.strip().isdigit() or int(count) < 1:
            raise InputError(f"--gpus {text!r}: the count of {model.strip()} must be a whole "
                             f"number >= 1, got {count.strip()!r}", hint=hint)
        if key not in KNOWN:
            raise InputError(f"--gpus {text!r}: no data for GPU model {key!r}; the simulator "
                             f"knows {REFERENCE} (measured) and "
                             f"{', '.join(DERIVED)} (derived)", hint=hint)
        if any(m == key for m, _ in layout):
            raise InputError(f"--gpus {text!r}: {key} is named twice", hint=hint)
        layout.append((key, int(count)))
    total = sum(c for _, c in layout)
    if len(layout) == 1 and layout[0][0] == REFERENCE:
        return total, ()   # h200:8 is the plain cluster
    return total, tuple(layout)


def derived_factor(p: Profile, model: str) -> float:
    """Solo speed of ``p``'s workload on ``model`` relative to the H200 (module docstring)."""
    if model == REFERENCE:
        return 1.0
    u, kernel = _kernel(p, model)
    return 1.0 / ((1.0 - u) + u * kernel)


def _busy_growth(p: Profile, model: str) -> float:
    """u'/u: how much larger a share of the time the workload keeps the slower GPU busy."""
    if model == REFERENCE or p.gpu_util <= 0:
        return 1.0
    u, kernel = _kernel(p, model)
    return kernel / ((1.0 - u) + u * kernel)


def _kernel(p: Profile, model: str) -> tuple[float, float]:
    """(u, the time its kernels take on ``model`` per unit on the H200): u the share of time
    the workload keeps the H200 busy, its kernels split by ``beta`` between memory-bound (at
    the model's bandwidth ratio) and compute-bound (at its compute ratio)."""
    compute, bandwidth, _ = DERIVED[model]
    u = min(1.0, max(0.0, p.gpu_util / 100.0))
    beta = min(1.0, p.mem_util / p.gpu_util) if p.gpu_util > 0 else 0.0
    return u, beta / bandwidth + (1.0 - beta) / compute


@dataclass(frozen=True)
class MixedTruth:
    """The true speed of a group of jobs on one GPU of a given model (solo factor included)."""

    truth: TruthModel
    profiles: Mapping[str, Profile]

    def factor(self, workload: str, model: str) -> float:
        return derived_factor(self.profiles[workload], model)

    def speeds(self, model: str, names: Sequence[str]) -> tuple[float, ...]:
        if model == REFERENCE:
            return self.truth.speeds(names)
        n = len(names)
        if n <= 1:
            return tuple(self.factor(w, model) for w in names)
        growth = {w: _busy_growth(self.profiles[w], model) for w in names}
        out = []
        for i, me in enumerate(names):
            slow = sum((1.0 / self.truth.pair_speed(me, other) - 1.0) * growth[other]
                       for j, other in enumerate(names) if j != i)
            out.append(self.factor(me, model) / (1.0 + slow))
        return tuple(out)


def derived_profiles(profiles: Mapping[str, Profile], model: str) -> list[Profile]:
    """The H200 profiles as the lab would have measured them solo on ``model``: the same
    utilisation (a simplification), the solo throughput scaled by the derived factor."""
    out = []
    for p in profiles.values():
        if p.solo_it_per_s:
            out.append(replace(p, gpu_model=model.upper(),
                               solo_it_per_s=p.solo_it_per_s * derived_factor(p, model)))
    return out


def sim_speeds(profiles: Mapping[str, Profile], layout: Sequence[tuple[str, int]]
               ) -> ModelSpeeds:
    """What iadeep knows of the models: every workload profiled solo on each (shipped H200
    profiles, plus the derived ones): the table the controller builds from a lab's profiles."""
    every = list(profiles.values())
    for m, _ in layout:
        if m != REFERENCE:
            every += derived_profiles(profiles, m)
    return model_speeds(every, [m for m, _ in layout])


def capacity(profiles: Mapping[str, Profile], workloads: Sequence[str],
             layout: Sequence[tuple[str, int]]) -> float:
    """The cluster in H200 equivalents for the workload mix (each GPU counts its mean solo
    factor), so ``--load 1.0`` saturates a mixed cluster running one job per GPU, as it does
    a plain one."""
    if not workloads:
        return float(sum(c for _, c in layout))
    return sum(c * sum(derived_factor(profiles[w], m) for w in workloads) / len(workloads)
               for m, c in layout)

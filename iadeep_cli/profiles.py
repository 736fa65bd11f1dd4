"""Workload profiles and co-location measurements, and how a learnt profile changes.

A ``Profile`` holds what a profiler can see while a job runs alone. Only ``gpu_util``,
``mem_util`` and ``peak_mem_gib`` are required: other labs' GPUs report less than an H200 (the
GPM metrics sm_util...fp16_util exist on Hopper and newer only), so every other field may be None.
A ``CoLocation`` is one measurement of jobs sharing a GPU. Both are shared vocabulary: the store
keeps them, the model fits on them, the scheduler and the simulator place by them.

How a profile learnt from jobs changes: slowly, and never because of one odd job. Every job
profiled alone gives one *sample*. A lab profile is the per-field median of the last ``WINDOW``
accepted samples (the peak memory is their maximum: placing by a median would under-reserve
memory for half the runs). A sample far from the earlier ones is rejected as an outlier, so one
user's idle or mislabelled job cannot rewrite a profile that every user's placements depend on.
"Far" is measured against the samples' own spread (3 scaled median absolute deviations) but
never tighter than ``FLOORS``, so a profile built from a few very similar runs still accepts
normal run-to-run noise.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from statistics import median
from typing import Any

OPTIONAL_FEATURES = ("solo_it_per_s", "power_w", "power_limit_w", "sm_util", "sm_occupancy",
                     "tensor_util", "fp32_util", "fp16_util")
REQUIRED_FEATURES = ("gpu_util", "mem_util", "peak_mem_gib")


@dataclass(frozen=True)
class Profile:
    workload: str
    gpu_util: float
    mem_util: float
    peak_mem_gib: float
    gpu_model: str = ""
    solo_it_per_s: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_util: float | None = None
    sm_occupancy: float | None = None
    tensor_util: float | None = None
    fp32_util: float | None = None
    fp16_util: float | None = None


@dataclass(frozen=True)
class CoLocation:
    """One measurement: jobs that shared a GPU and each one's speed relative to running alone."""

    gpu_model: str
    jobs: tuple[str, ...]
    speeds: tuple[float, ...]
    samples: int = 1


# Suffix of a provisional profile's name (``provisional_profile``): its predictions are cached
# apart from the measured profile's of the same label.
PROVISIONAL = "#prior"
# A new job sharing its GPU is profiled from its own per-process figures only while the GPU is
# less busy than this (%): with time to spare nobody's kernels wait, so its SM share is what it
# would use alone; on a saturated GPU the jobs slice its time and the share would read light
# (and a light first sample would have the label's later samples alone rejected as outliers).
# The controller's profile step and the simulator's ``Profiler`` both go by it.
SHARED_SAMPLE_BELOW_UTIL = 90.0


def provisional_profile(known: Mapping[str, Profile], label: str) -> Profile | None:
    """A provisional profile for a program never profiled, under which it may share a GPU
    while it is profiled from its own per-process figures (the controller's and the
    simulator's ``cold_start: share``): each figure the largest among ``known`` (as heavy as
    the heaviest job the lab knows, its memory the largest), so placement shares it only where
    even a heavy job pays. Named ``label#prior``; None when nothing is known to take it from."""
    ps = list(known.values())
    if not ps:
        return None

    def top(attr: str) -> float | None:
        vals = [getattr(p, attr) for p in ps if getattr(p, attr) is not None]
        return max(vals) if vals else None
    base = max(ps, key=lambda p: (p.gpu_util, p.workload))
    return replace(base, workload=label + PROVISIONAL, gpu_util=top("gpu_util") or 100.0,
                   mem_util=top("mem_util") or 0.0, peak_mem_gib=top("peak_mem_gib") or 0.0,
                   power_w=top("power_w"))


# a measured co-located speed a fit accepts: (0, MAX_MEASURED_SPEED] (0: no progress at all)
MAX_MEASURED_SPEED = 2.0


def measurable(speeds: Sequence[float]) -> bool:
    """Whether every one of a co-location's measured speeds is one a fit accepts."""
    return all(0.0 < float(y) <= MAX_MEASURED_SPEED for y in speeds)


# ---------------------------------------------------------------------------------------------
# Learning: merging a job's sample into its profile (``store.profiles.learn`` applies these).
# ---------------------------------------------------------------------------------------------
WINDOW = 9
_MAD_SCALE = 1.4826   # MAD -> standard deviation for normally distributed noise
# Tolerance floors per checked feature, as a function of the earlier samples' median.
FLOORS: dict[str, Callable[[float], float]] = {
    "gpu_util": lambda med: 20.0,                     # percentage points
    "mem_util": lambda med: 20.0,                     # percentage points
    "peak_mem_gib": lambda med: max(2.0, 0.5 * med),  # GiB
}


def outlier_reason(sample: Profile, history: Sequence[Profile]) -> str | None:
    """Why ``sample`` is too far from ``history`` to be merged, or None if it fits."""
    if not history:
        return None
    for name, floor in FLOORS.items():
        earlier = [getattr(h, name) for h in history]
        mid = median(earlier)
        spread = median(abs(v - mid) for v in earlier) * _MAD_SCALE
        allowed = max(floor(mid), 3 * spread)
        value = getattr(sample, name)
        if abs(value - mid) > allowed:
            return (f"{name} {value:.1f} is far from the median {mid:.1f} of {len(earlier)} "
                    f"earlier sample(s) (allowed +-{allowed:.1f})")
    return None


def agrees(a: Profile, b: Profile, rate_tolerance: float) -> bool:
    """Whether two phase samples of a workload say the same thing (so jobs of two users
    corroborate a phase change): neither is an outlier against the other (``FLOORS``), and
    their solo rates, where both have one, differ by at most ``rate_tolerance`` (relative)."""
    if outlier_reason(a, [b]) is not None:
        return False
    ra, rb = a.solo_it_per_s, b.solo_it_per_s
    if ra is None or rb is None:
        return ra is None and rb is None
    return min(ra, rb) > 0 and max(ra, rb) / min(ra, rb) - 1.0 <= rate_tolerance


# How far two co-location measurements of the same pair may differ (each speed, relative) and
# still say the same thing: jobs of two members corroborate a pair (``pair_agrees``).
PAIR_TOLERANCE = 0.25


def pair_agrees(a: CoLocation, b: CoLocation, tolerance: float = PAIR_TOLERANCE) -> bool:
    """Whether two measurements of a pair say the same thing: the same GPU model and
    workloads, and each workload's speed within ``tolerance`` (relative) of the other's."""
    if a.gpu_model != b.gpu_model or len(a.jobs) != 2 or len(b.jobs) != 2:
        return False
    orders = [b.speeds] if b.jobs == a.jobs else []
    if b.jobs == a.jobs[::-1]:
        orders.append(b.speeds[::-1])
    return any(all(min(x, y) > 0 and max(x, y) / min(x, y) - 1.0 <= tolerance
                   for x, y in zip(a.speeds, other)) for other in orders)


def merged(samples: Sequence[Profile]) -> Profile:
    """The profile of the last WINDOW samples: medians, the peak memory's maximum; an optional
    field is the median of the samples that have it (None if none has)."""
    window = samples[-WINDOW:]
    values: dict[str, Any] = {}
    for f in fields(Profile):
        if f.name in ("workload", "gpu_model"):
            continue
        known = [getattr(s, f.name) for s in window if getattr(s, f.name) is not None]
        values[f.name] = (max(known) if f.name == "peak_mem_gib" else median(known)) \
            if known else None
    return replace(window[-1], **values)


# ---------------------------------------------------------------------------------------------
# GPU models: one short key per model, so a poll's name and a profile's name meet.
# ---------------------------------------------------------------------------------------------
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})


def gpu_model_key(name: str | None) -> str:
    """A GPU's product name as nvidia-smi or NVML report it -> a short key: "NVIDIA H200" ->
    "h200", "NVIDIA A100-SXM4-80GB" -> "a100", "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA GeForce RTX 4090" -> "rtx4090", "Tesla V100-SXM2-32GB" -> "v100"; "" for none.

    Why a key and not the name: the same model appears under several names (form factor and
    memory suffixes, "Tesla"/"GeForce" brands), and profiles, pairs and placement must treat
    them as one model. Rule: lower case, vendor and brand words dropped, words taken up to and
    including the first one with a digit, each cut at its first '-', joined without spaces.
    Keys are stable for names seen before; a name with no digit keeps all its words.
    """
    words = [w for w in (name or "").lower().replace("_", " ").split()
             if w not in _VENDOR_WORDS]
    out: list[str] = []
    for w in words:
        part = w.split("-", 1)[0]
        if part:
            out.append("".join(c for c in part if c.isalnum()))
        if any(c.isdigit() for c in w):
            break
    return "".join(out)

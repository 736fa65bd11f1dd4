"""How a profile learnt from jobs changes: slowly, and never because of one odd job.

Every job profiled alone gives one *sample*. A lab profile is the per-field median of the last
``WINDOW`` accepted samples (the peak memory is their maximum: placing by a median would
under-reserve memory for half the runs). A sample far from the earlier ones is rejected as an
outlier, so one user's idle or mislabelled job cannot rewrite a profile that every user's
placements depend on. "Far" is measured against the samples' own spread (3 scaled median
absolute deviations) but never tighter than ``FLOORS``, so a profile built from a few very
similar runs still accepts normal run-to-run noise.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from statistics import median
from typing import Any

from .profiles import Profile

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

"""Online learning pieces: turn what the poller and progress files see into model inputs."""
from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from ..errors import InputError
from ..profiles import Profile
from ..snapshot import GpuSample


def observed_speed(rate_it_per_s: float, solo_it_per_s: float) -> float:
    """Co-located speed = measured rate / solo rate (the same definition as pairs.csv)."""
    if solo_it_per_s is None or solo_it_per_s <= 0:
        raise InputError(f"solo rate {solo_it_per_s!r} must be > 0",
                         hint="profile the workload alone first")
    if rate_it_per_s < 0:
        raise InputError(f"rate {rate_it_per_s!r} must be >= 0")
    return rate_it_per_s / solo_it_per_s


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return fmean(vals) if vals else None


def profile_from_samples(workload: str, gpu_model: str, samples: Sequence[GpuSample],
                         peak_mem_gib: float, solo_it_per_s: float | None = None) -> Profile:
    """A solo profile from GPU samples taken while the job ran alone (means of each metric)."""
    util = _mean(s.utilization_gpu for s in samples)
    if util is None:
        raise InputError(f"no GPU utilisation among {len(samples)} samples of {workload!r}",
                         hint="sample the GPU while the job runs alone")
    return Profile(workload=workload, gpu_model=gpu_model, gpu_util=util,
                   mem_util=_mean(s.utilization_memory for s in samples) or 0.0,
                   peak_mem_gib=peak_mem_gib, solo_it_per_s=solo_it_per_s,
                   power_w=_mean(s.power_draw_w for s in samples),
                   power_limit_w=_mean(s.power_limit_w for s in samples))

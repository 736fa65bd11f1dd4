"""Interference model: workload profiles and a pairwise co-location speed predictor."""

from .online import observed_speed, profile_from_samples  # noqa: F401

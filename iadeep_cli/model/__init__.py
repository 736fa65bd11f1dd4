"""Interference model: workload profiles and a pairwise co-location speed predictor."""

"""``fit_model(scaled_first=True)``: the one-standard-error rule of the inner cross-validation
takes the scaled rule (the base rule times one fitted factor) as the simplest prior, before
the rule itself. Off by default: on the H200 data it changes the shipped model."""
from __future__ import annotations

import pytest

from iadeep_cli.model.data import shipped_pairs, shipped_profiles
from iadeep_cli.model.predictor import fit_model

pytestmark = pytest.mark.unit


def test_the_scaled_rule_is_kept_only_when_it_comes_first():
    default = fit_model(shipped_profiles(), shipped_pairs())
    scaled = fit_model(shipped_profiles(), shipped_pairs(), scaled_first=True)
    assert "prior: the analytic rule;" in default.note
    assert "prior: the analytic rule x" in scaled.note
    a, b = shipped_profiles()["vgg16"], shipped_profiles()["resnet50"]
    assert default.predict_pair(a, b) != scaled.predict_pair(a, b)

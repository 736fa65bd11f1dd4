"""``model/evaluate.learning_curve``: a new workload's held-out error after its first k
observed pairs. The protocol is checked with a model that knows exactly the pairs it was
trained on and guesses 0.5 elsewhere, so what is scored, and what is learnt, can be seen."""
from __future__ import annotations

import pytest

from iadeep_cli.errors import InputError
from iadeep_cli.model.data import shipped_pairs, shipped_profiles
from iadeep_cli.model.evaluate import learning_curve
from iadeep_cli.model.predictor import PairPrediction

pytestmark = pytest.mark.unit
PROFILES = shipped_profiles()
PAIRS = shipped_pairs()


class Lookup:
    def __init__(self, observations):
        self.known = {}
        for o in observations:
            self.known[o.jobs] = o.speeds
            self.known[o.jobs[::-1]] = o.speeds[::-1]

    def predict_pair(self, a, b):
        sa, sb = self.known.get((a.workload, b.workload), (0.5, 0.5))
        return PairPrediction(sa, sb, 1.0, "lookup")


def test_observed_pairs_are_learnt_from_but_never_scored():
    seen = []

    def fit(profiles, train):
        seen.append(len(train))
        return Lookup(train)
    points = learning_curve(PROFILES, PAIRS, {}, (0, 1, 3), draws=2, fit=fit)
    assert [p.k for p in points] == [0, 1, 3]
    # a model that knows only its training pairs scores the same on the pairs left: none of
    # the k observed ones is ever among the scored
    assert points[0].mae_model == points[1].mae_model == points[2].mae_model
    assert all(p.n_groups == 7 and p.n_predictions == 7 * 2 * 4 * 2 for p in points)
    # each workload's 7 pairs held out, then k of them added back: 21, 22 and 24 pairs
    assert sorted(set(seen)) == [21, 22, 24]


def test_a_k_beyond_a_workloads_pairs_is_left_out_and_bad_input_is_refused():
    points = learning_curve(PROFILES, PAIRS, {}, (0, 10), draws=1,
                            fit=lambda p, train: Lookup(train))
    assert [p.k for p in points] == [0]       # 7 pairs a workload: none left after 10
    with pytest.raises(InputError, match="observed pairs must be >= 0"):
        learning_curve(PROFILES, PAIRS, {}, (-1,), fit=lambda p, t: Lookup(t))

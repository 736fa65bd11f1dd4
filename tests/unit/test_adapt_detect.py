"""Run-time adaptation, detection (scheduler/detectors.py): what counts as sharing gone wrong, that
it must persist, and that the measurements' own jitter never counts."""
import random
from pathlib import Path

import pytest
import yaml

from iadeep_cli.errors import ConfigError
from iadeep_cli.inventory import load_inventory, parse_inventory
from iadeep_cli.model.data import shipped_pairs
from iadeep_cli.scheduler.detectors import (
    UNDERPERFORMS,
    WORSE_THAN_SERIAL,
    Detector,
    Sharer,
    closed_gpus,
    last_joined,
    symptom,
)
from iadeep_cli.settings import AdaptPolicy

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
FAST = AdaptPolicy(observe_s=30, polls=3, stop_partners=True, suspend=True)


def pair(a: float | None, b: float | None, pa=0.8, pb=0.8, **kw) -> list[Sharer]:
    return [Sharer(1, a, pa, joined_at=10.0, **kw), Sharer(2, b, pb, joined_at=20.0)]


def test_symptoms_of_one_poll():
    assert symptom(pair(0.78, 0.8), FAST) is None
    s = symptom(pair(0.6, 0.8), FAST)
    assert s is not None and s.kinds == {UNDERPERFORMS}
    assert "job 1 at 0.60 (predicted 0.80, margin 0.15)" in s.detail
    s = symptom(pair(0.45, 0.45, pa=0.5, pb=0.5), FAST)
    assert s is not None and s.kinds == {WORSE_THAN_SERIAL}
    assert "0.45+0.45 = 0.90" in s.detail
    both = symptom(pair(0.3, 0.4), FAST)
    assert both is not None and both.kinds == {UNDERPERFORMS, WORSE_THAN_SERIAL}
    # its own --min-speed floor counts, even when the prediction was as low
    floored = [Sharer(1, 0.55, 0.6, floor=0.7), Sharer(2, 0.9, 0.9)]
    s = symptom(floored, FAST)
    assert s is not None and "its --min-speed 0.7" in s.detail
    # a job without a speed cannot make the sum: only per-job checks
    assert symptom(pair(0.45, None, pa=0.5), FAST) is None


def test_a_symptom_must_last_the_observation_time_and_the_polls():
    det = Detector()
    bad = {"n1:0": pair(0.3, 0.4)}
    # three polls but only 20 s: nothing yet
    assert det.observe(0, bad, FAST) == {}
    assert det.observe(10, bad, FAST) == {}
    assert det.observe(20, bad, FAST) == {}
    found = det.observe(30, bad, FAST)["n1:0"]
    assert found.worse_than_serial and found.polls == 4 and found.since == 0
    assert found.describe(30).endswith("for 30 s over 4 polls")
    # long enough but too few polls: nothing
    det2 = Detector()
    assert det2.observe(0, bad, FAST) == {}
    assert det2.observe(100, bad, FAST) == {}
    assert "n1:0" in det2.observe(200, bad, FAST)


def test_one_good_poll_breaks_a_streak_but_not_a_finding():
    det = Detector()
    bad, good = {"n1:0": pair(0.3, 0.4)}, {"n1:0": pair(0.8, 0.8)}
    det.observe(0, bad, FAST)
    det.observe(20, bad, FAST)
    det.observe(25, good, FAST)   # streak broken
    assert det.observe(40, bad, FAST) == {} and det.observe(60, bad, FAST) == {}
    assert det.observe(80, bad, FAST) != {}   # 40..80, three polls
    # hysteresis: it takes `polls` good polls to end a finding
    assert det.observe(90, good, FAST) != {}
    assert det.observe(100, good, FAST) != {}
    assert det.observe(110, good, FAST) == {}


def test_no_data_neither_counts_nor_breaks_and_new_jobs_start_over():
    det = Detector()
    bad, blind = {"n1:0": pair(0.3, 0.4)}, {"n1:0": pair(None, None)}
    det.observe(0, bad, FAST)
    det.observe(20, blind, FAST)
    det.observe(25, bad, FAST)
    assert det.observe(40, bad, FAST) != {}   # three bad polls, 40 s
    other = {"n1:0": [Sharer(1, 0.3, 0.8), Sharer(3, 0.4, 0.8)]}
    assert det.observe(50, other, FAST) == {}   # job 2 left, job 3 came: about them, anew
    assert det.observe(60, {}, FAST) == {}      # the GPU is no longer shared: forgotten


def test_last_joined_skips_opted_out_jobs():
    sharers = [Sharer(1, 0.4, 0.8, joined_at=10), Sharer(2, 0.4, 0.8, joined_at=20)]
    assert last_joined(sharers).job_id == 2
    sharers[1] = Sharer(2, 0.4, 0.8, joined_at=20, adapt=False)
    assert last_joined(sharers).job_id == 1
    assert last_joined([Sharer(1, 0.4, 0.8, adapt=False)]) is None
    # an opportunistic job goes first, even when it was there first
    assert last_joined([Sharer(1, 0.4, 0.8, joined_at=10, opportunistic=True),
                        Sharer(2, 0.4, 0.8, joined_at=20)]).job_id == 1


def test_closed_gpus_follow_the_policy():
    det = Detector()
    bad = {"n1:0": pair(0.3, 0.4)}
    for t in (0, 10, 20, 30):
        found = det.observe(t, bad, FAST)
    assert "worse than serial" in closed_gpus(found, 30, FAST)["n1:0"]
    assert closed_gpus(found, 30, AdaptPolicy(stop_partners=False)) == {}
    assert closed_gpus(found, 30, AdaptPolicy()) == {}   # closing is off by default
    assert closed_gpus(found, 30, AdaptPolicy(enabled=False)) == {}


@pytest.mark.parametrize("seed", range(5))
def test_the_shipped_measurements_jitter_triggers_nothing(seed):
    """Every shipped pair that placement would make (combined >= share_threshold 1.1), predicted
    exactly as measured, observed with the measurements' +-2% spread, for an hour of 10 s polls
    with the default policy: no finding, ever."""
    rng = random.Random(seed)
    policy = AdaptPolicy()
    pairs = [c for c in shipped_pairs() if len(c.jobs) == 2 and sum(c.speeds) >= 1.1]
    assert len(pairs) >= 10
    det = Detector()
    for t in range(0, 3600, 10):
        gpus = {f"n{i}:0": [Sharer(1, s0 * rng.uniform(0.98, 1.02), s0),
                            Sharer(2, s1 * rng.uniform(0.98, 1.02), s1)]
                for i, c in enumerate(pairs) for s0, s1 in [c.speeds]}
        assert det.observe(float(t), gpus, policy) == {}
    # the same pairs really slowed by a third are found (so the test above could fail)
    slowed = {f"n{i}:0": [Sharer(1, c.speeds[0] * 0.66, c.speeds[0]),
                          Sharer(2, c.speeds[1] * 0.66, c.speeds[1])]
              for i, c in enumerate(pairs)}
    det = Detector()
    found = {}
    for t in range(0, 400, 10):
        found = det.observe(float(t), slowed, policy)
    assert len(found) == len(pairs)


def test_policy_adapt_in_the_inventory():
    inv = parse_inventory("lab:\n  policy:\n    adapt: {observe_s: 60, polls: 2, suspend: true}\n"
                          "nodes: []\n", Path("nodes.yaml"))
    a = inv.policy.adapt
    assert (a.observe_s, a.polls, a.suspend, a.margin) == (60, 2, True, 0.15)
    assert parse_inventory("nodes: []\n", Path("n.yaml")).policy.adapt == AdaptPolicy()
    for text, expected in (
            ("margin: 0.01", "lab.policy.adapt.margin: expected a speed margin in [0.02, 1)"),
            ("polls: 0", "lab.policy.adapt.polls: expected a whole number >= 1"),
            ("suspend: maybe", "lab.policy.adapt.suspend: expected true or false"),
            ("observe: 5", "lab.policy.adapt.observe: unknown key 'observe'")):
        with pytest.raises(ConfigError) as info:
            parse_inventory(f"lab:\n  policy:\n    adapt: {{{text}}}\n", Path("nodes.yaml"))
        assert expected in info.value.message
    # the example documents every key, with the defaults
    from iadeep_cli import inventory
    shown = yaml.safe_load((ROOT / "nodes.yaml.example").read_text())["lab"]["policy"]["adapt"]
    assert set(shown) == set(inventory._ADAPT_FIELDS)
    assert load_inventory(ROOT / "nodes.yaml.example").policy.adapt == AdaptPolicy()


def test_the_defaults_refresh_only_and_the_other_actions_can_be_turned_on():
    """By default only the phase refresh acts on running jobs (and --opportunistic jobs yield):
    on the simulator's phase-shift grid suspending and closing GPUs cost more than they saved.
    nodes.yaml turns them back on."""
    d = AdaptPolicy()
    assert (d.enabled, d.phase, d.yield_opportunistic) == (True, True, True)
    assert (d.suspend, d.stop_partners) == (False, False)
    on = parse_inventory("lab:\n  policy:\n    adapt: {suspend: true, stop_partners: true}\n"
                         "nodes: []\n", Path("nodes.yaml")).policy.adapt
    assert (on.suspend, on.stop_partners) == (True, True)


def test_checkpoint_signal_is_checked_like_signal():
    from iadeep_cli.errors import InputError
    from iadeep_cli.jobs import JobSpec, parse_checkpoint_signal, validate_spec

    assert parse_checkpoint_signal("sigusr1") == "USR1"
    validate_spec(JobSpec("/s/a.sh", checkpoint_signal="USR2"))
    for bad in ("KILL", "STOP", "USR1@60", ""):
        with pytest.raises(InputError) as info:
            validate_spec(JobSpec("/s/a.sh", checkpoint_signal=bad))
        assert info.value.message.startswith("--checkpoint-signal ")
        assert "USR1" in (info.value.hint or "")

"""The simulator's mixed cluster (sim/mixed.py): --gpus parsing, the derived second model's
truth, the engine running each GPU at its model's speed, and the CLI with its errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from iadeep_cli.errors import InputError
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.settings import Policy
from iadeep_cli.sim.engine import SimJob, make_planner, simulate
from iadeep_cli.sim.mixed import MixedTruth, derived_factor, parse_gpus, sim_speeds
from iadeep_cli.sim.truth import TruthModel

PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
IADEEP = [str(Path(sys.executable).parent / "iadeep")]


def cli(*args):
    return subprocess.run(IADEEP + list(args), capture_output=True, text=True, timeout=240)


def test_parse_gpus():
    assert parse_gpus("8") == (8, ())
    assert parse_gpus("h200:8") == (8, ())             # the plain cluster
    assert parse_gpus("h200:8,a100:4") == (12, (("h200", 8), ("a100", 4)))
    assert parse_gpus(" A100:2 , H200:1 ") == (3, (("a100", 2), ("h200", 1)))
    for bad, words in (("h200:x", "count of h200"), ("h200", "MODEL:COUNT"),
                       ("v100:4", "no data for GPU model 'v100'"), ("0", ">= 1"),
                       ("h200:8,h200:2", "named twice"), ("a100:0", "count of a100")):
        with pytest.raises(InputError, match=words):
            parse_gpus(bad)


def test_derived_factor_follows_the_documented_formula():
    p = PROFILES["resnet18"]
    u, beta = p.gpu_util / 100, p.mem_util / p.gpu_util
    expected = 1 / ((1 - u) + u * (beta / 0.42 + (1 - beta) / 0.5))
    assert derived_factor(p, "a100") == pytest.approx(expected)
    assert derived_factor(p, "h200") == 1.0
    # the launch-bound mlp loses least, the busy transformer most
    f = {w: derived_factor(q, "a100") for w, q in PROFILES.items()}
    assert max(f, key=f.get) == "mlp" and min(f, key=f.get) == "resnet50"
    assert min(f.values()) > 0.45 and max(f.values()) < 0.95


def test_derived_pair_scales_the_h200_slowdown_by_the_partners_busy_growth():
    mixed = MixedTruth(TRUTH, PROFILES)
    assert mixed.speeds("h200", ["lstm", "ncf"]) == TRUTH.speeds(["lstm", "ncf"])
    s_lstm, _ = mixed.speeds("a100", ["lstm", "ncf"])
    ncf = PROFILES["ncf"]
    u, beta = ncf.gpu_util / 100, ncf.mem_util / ncf.gpu_util
    kernel = beta / 0.42 + (1 - beta) / 0.5
    growth = kernel / ((1 - u) + u * kernel)
    slow = (1 / TRUTH.pair_speed("lstm", "ncf") - 1) * growth
    assert s_lstm == pytest.approx(derived_factor(PROFILES["lstm"], "a100") / (1 + slow))


def test_engine_runs_a_job_at_its_models_speed():
    """One job alone on each model: on the h200 it takes its duration, on the a100 its
    duration over the derived factor."""
    mixed = MixedTruth(TRUTH, PROFILES)
    sp = sim_speeds(PROFILES, [("h200", 1), ("a100", 1)])
    for layout, factor in (((("h200", 1),), 1.0),
                           ((("a100", 1),), derived_factor(PROFILES["vgg16"], "a100"))):
        planner = make_planner("iadeep", PROFILES, TRUTH, TRUTH, Policy(), {1: 0.0}, 0, sp)
        r = simulate([SimJob(1, 0.0, "vgg16", 1000.0)], planner, TRUTH, gpus=1,
                     profiles=PROFILES, layout=layout, mixed=mixed)
        assert r.jcts == pytest.approx((1000.0 / factor,))


def test_nobody_waiting_a_job_takes_the_faster_model():
    mixed = MixedTruth(TRUTH, PROFILES)
    sp = sim_speeds(PROFILES, [("a100", 1), ("h200", 1)])
    planner = make_planner("iadeep", PROFILES, TRUTH, TRUTH, Policy(), {1: 0.0}, 0, sp)
    r = simulate([SimJob(1, 0.0, "transformer", 1000.0)], planner, TRUTH, gpus=2,
                 gpus_per_node=1, profiles=PROFILES, layout=(("a100", 1), ("h200", 1)),
                 mixed=mixed)
    assert r.jcts == pytest.approx((1000.0,))          # the h200, though the a100 node is n0
    blind = make_planner("iadeep-blind-model", PROFILES, TRUTH, TRUTH, Policy(), {1: 0.0}, 0,
                         sp)
    r = simulate([SimJob(1, 0.0, "transformer", 1000.0)], blind, TRUTH, gpus=2,
                 gpus_per_node=1, profiles=PROFILES, layout=(("a100", 1), ("h200", 1)),
                 mixed=mixed)
    assert r.jcts[0] > 1500.0                          # first by name: the a100


def test_cli_mixed_cluster():
    out = cli("sim", "--json", "--jobs", "40", "--gpus", "h200:8,a100:8", "--policies",
              "exclusive,iadeep,iadeep-blind-model")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["settings"]["gpus"] == 16
    assert data["settings"]["layout"] == [["h200", 8], ["a100", 8]]
    assert set(data["policies"]) == {"exclusive", "iadeep", "iadeep-blind-model"}
    assert all(p["jobs"] == 40 for p in data["policies"].values())
    text = cli("sim", "--jobs", "40", "--gpus", "h200:8,a100:8", "--policies",
               "exclusive,iadeep").stdout
    assert "h200:8,a100:8 GPUs" in text


def test_cli_plain_number_is_unchanged():
    a = cli("sim", "--jobs", "40", "--gpus", "8", "--policies", "exclusive,iadeep")
    b = cli("sim", "--jobs", "40", "--gpus", "h200:8", "--policies", "exclusive,iadeep")
    assert a.returncode == 0 and a.stdout == b.stdout and "; 8 GPUs;" in a.stdout


@pytest.mark.parametrize("bad,word", [("h200:x", "count of h200"), ("v100:4", "v100"),
                                      ("eight", "MODEL:COUNT")])
def test_cli_bad_gpus_is_one_line(bad, word):
    out = cli("sim", "--gpus", bad)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --gpus") and word in lines[0]

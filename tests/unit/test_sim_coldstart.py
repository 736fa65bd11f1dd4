"""``iadeep sim --new-workloads F``, ``--cold-start``, ``--coarse-labels`` and
``--wrong-labels`` (sim/coldstart.py): a job's label apart from its workload; a new program
waits for an empty GPU and is profiled alone, as the controller does, before anything shares
with it; ``share`` profiles it while it shares, under a provisional heavy profile."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from iadeep_cli.errors import InputError
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.settings import Policy
from iadeep_cli.sim import coldstart as cs
from iadeep_cli.sim.engine import SimJob, generate_jobs, make_planner, simulate
from iadeep_cli.sim.run import SimSettings, _believed
from iadeep_cli.sim.truth import TruthModel

pytestmark = pytest.mark.unit
PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
IADEEP = [str(Path(sys.executable).parent / "iadeep")]


def _run(jobs, mode="alone", name="iadeep-static"):
    known, truth_of, learner = _believed(SimSettings(cold_start=mode), PROFILES, TRUTH, jobs)
    planner = make_planner(name, known, truth_of, truth_of, Policy(), {j.id: 0.0 for j in jobs},
                           0)
    r = simulate(jobs, planner, TRUTH, gpus=1, profiles=PROFILES, name=name, learner=learner)
    return r, learner, known


def test_a_new_program_waits_for_an_empty_gpu_where_a_known_one_shares():
    known = [SimJob(1, 0.0, "mlp", 5000.0), SimJob(2, 10.0, "mlp", 1000.0)]
    new = [known[0], SimJob(2, 10.0, "mlp", 1000.0, label=cs.new_label("mlp", 2))]
    shared, _, _ = _run(known)
    cold, learner, believed = _run(new)
    assert shared.shared_frac == 1.0 and shared.jcts[1] < 5000.0
    # the new one starts only when the first ends, alone, and is profiled there
    assert cold.shared_frac == 0.0 and cold.jcts[1] >= 5000.0 - 10.0 + 1000.0 - 1e-6
    took = cs.PROFILE_SAMPLES * cs.POLL_S
    assert learner.learnt == {"mlp-new2": pytest.approx(5000.0 + took, abs=cs.POLL_S)}
    assert believed["mlp-new2"].gpu_util == pytest.approx(PROFILES["mlp"].gpu_util, rel=0.03)


def test_a_job_may_join_a_new_program_only_once_it_is_profiled():
    jobs = [SimJob(1, 0.0, "mlp", 20000.0, label="mlp-new1"), SimJob(2, 30.0, "mlp", 1000.0)]
    r, learner, _ = _run(jobs)
    t_learnt = learner.learnt["mlp-new1"]
    took = cs.PROFILE_SAMPLES * cs.POLL_S
    assert took - cs.POLL_S <= t_learnt <= took + cs.POLL_S
    assert r.shared_frac == 1.0
    # job 2 waited until the profile was recorded, then joined (it ran slower than alone)
    assert r.jcts[1] > t_learnt - 30.0 + 1000.0


def test_with_cold_start_share_a_new_program_shares_at_once_and_is_profiled_sharing():
    jobs = [SimJob(1, 0.0, "mlp", 20000.0), SimJob(2, 10.0, "mlp", 3000.0, label="mlp-new2")]
    alone, _, _ = _run(jobs, "alone")
    share, learner, believed = _run(jobs, "share")
    assert alone.shared_frac == 0.0
    assert share.shared_frac == 1.0 and share.jcts[1] < alone.jcts[1]
    assert "mlp-new2" in learner.learnt and not believed["mlp-new2"].workload.endswith("#prior")


def test_the_provisional_profile_is_as_heavy_as_the_heaviest_known():
    p = cs.prior_profile(PROFILES, "x-new1")
    assert p.workload == "x-new1#prior"
    assert p.gpu_util == max(q.gpu_util for q in PROFILES.values())
    assert p.peak_mem_gib == max(q.peak_mem_gib for q in PROFILES.values())
    assert p.mem_util == max(q.mem_util for q in PROFILES.values())


def test_new_workloads_choose_the_fraction_and_keep_the_trace():
    jobs = generate_jobs(sorted(PROFILES), 100, 8, 1.2, 3)
    marked = cs.mark_new_workloads(jobs, 0.3, 3)
    assert sum(1 for j in marked if j.label) == 30
    assert all(j.label == f"{j.workload}-new{j.id}" for j in marked if j.label)
    assert [(j.id, j.submit_s, j.workload, j.duration_s) for j in marked] == \
        [(j.id, j.submit_s, j.workload, j.duration_s) for j in jobs]
    assert cs.mark_new_workloads(jobs, 0.0, 3) == jobs
    with pytest.raises(InputError, match="--new-workloads must be a fraction"):
        cs.mark_new_workloads(jobs, 1.5, 3)


def test_coarse_labels_put_two_programs_under_the_first_ones_name():
    assert cs.coarse_pairs(["b", "a", "d", "c", "e"]) == {"b": "a", "d": "c"}
    jobs = [SimJob(i, float(i), w, 100.0) for i, w in enumerate(["a", "b", "c", "e"], 1)]
    marked = cs.mark_labels(jobs, ["a", "b", "c", "d", "e"], coarse=True)
    assert [j.label for j in marked] == ["", "a", "", ""]
    wrong = cs.mark_labels(jobs, ["a", "b", "c"], wrong=0.5, seed=1)
    assert sum(1 for j in wrong if j.label) == 2
    assert all(j.label != j.workload for j in wrong if j.label)


def test_the_oracle_sees_a_new_programs_truth_and_a_coarse_labels_named_truth():
    jobs = [SimJob(1, 0.0, "mlp", 1.0, label="mlp-new1"), SimJob(2, 0.0, "mlp", 1.0,
                                                                  label="lstm")]
    t = cs.LabelledTruth(TRUTH, jobs)
    assert t.speeds(["mlp-new1", "lstm"]) == TRUTH.speeds(["mlp", "lstm"])
    assert t.speeds(["mlp-new1#prior", "vgg16"]) == TRUTH.speeds(["mlp", "vgg16"])


def test_cli_rejects_a_bad_cold_start_with_one_line():
    out = subprocess.run([*IADEEP, "sim", "--jobs", "5", "--cold-start", "later"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("Error: --cold-start must be one of alone, share, got 'later'")

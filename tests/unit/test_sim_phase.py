"""``iadeep sim --phase-shift F`` and the run-time adaptation of the ``iadeep`` policy
(sim/adaptive.py) against ``iadeep-static``: the truth switches with a job that changes
workload, the static policy never acts, the adaptive one suspends and refreshes, and a bad F is
one clear line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from iadeep_cli.errors import InputError
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.settings import AdaptPolicy, Policy
from iadeep_cli.sim.engine import SimJob, add_phase_shifts, generate_jobs, make_planner, simulate
from iadeep_cli.sim.truth import TruthModel

pytestmark = pytest.mark.unit
PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
IADEEP = [str(Path(sys.executable).parent / "iadeep")]
# every run-time action on: suspending and closing GPUs are off by default (refresh only)
ALL_ACTIONS = Policy(adapt=AdaptPolicy(suspend=True, stop_partners=True))


def _run(jobs, name, gpus=1, policy=Policy()):
    planner = make_planner(name, PROFILES, TRUTH, TRUTH, policy, {j.id: 0.0 for j in jobs}, 0)
    return simulate(jobs, planner, TRUTH, gpus=gpus, profiles=PROFILES, name=name,
                    policy=policy), planner


def test_a_job_that_switches_to_a_heavy_workload_slows_its_partner_from_then_on():
    """Two mlp jobs share one GPU (packing); job 1 becomes resnet50 after 20% of its work: from
    then on both run at the measured resnet50+mlp speeds, not mlp+mlp."""
    a = TRUTH.speeds(["mlp", "mlp"])[0]
    b1, b2 = TRUTH.speeds(["resnet50", "mlp"])
    assert b2 < a - 0.05                            # the partner really is slower next to it
    jobs = [SimJob(1, 0.0, "mlp", 100.0, phase_at=0.2, phase_to="resnet50"),
            SimJob(2, 0.0, "mlp", 1000.0)]
    r, _ = _run(jobs, "packing")
    t_sw = 20.0 / a
    t1 = t_sw + 80.0 / b1
    t2 = t1 + (1000.0 - a * t_sw - b2 * (t1 - t_sw))
    assert r.jcts == pytest.approx((t1, t2))
    unswitched, _ = _run([SimJob(1, 0.0, "mlp", 100.0), SimJob(2, 0.0, "mlp", 1000.0)],
                         "packing")
    assert r.jcts[1] > unswitched.jcts[1] + 1.0


def _worse_than_serial_pair():
    # mlp + mlp share (predicted 0.90 each); both become resnet50 (0.46 each: worse than serial)
    return [SimJob(1, 0.0, "mlp", 20000.0, phase_at=0.2, phase_to="resnet50"),
            SimJob(2, 10.0, "mlp", 20000.0, phase_at=0.2, phase_to="resnet50")]


def test_iadeep_static_takes_no_action_and_iadeep_suspends_the_last_joiner():
    static, sp = _run(_worse_than_serial_pair(), "iadeep-static", policy=ALL_ACTIONS)
    adaptive, ap = _run(_worse_than_serial_pair(), "iadeep", policy=ALL_ACTIONS)
    assert sp.hooks is None and static.shared_frac == 1.0
    assert ap.hooks is not None and ap.hooks.suspensions == 1
    # both worse than serial to the end under static; adaptive runs them mostly one at a time
    assert sum(adaptive.jcts) < sum(static.jcts) * 0.95
    # the first job (it came first) was not the one suspended: it finishes sooner than static
    assert adaptive.jcts[0] < static.jcts[0]


def test_iadeep_refreshes_a_phase_changed_profile_and_places_by_it():
    """A job labelled resnet18 becomes vgg16 while alone; a vgg16 job arrives later. The
    static policy still believes resnet18 and pairs them (really vgg16+vgg16, worse than
    serial); the adaptive one saw the phase change, refreshed the job's profile and does not."""
    jobs = [SimJob(1, 0.0, "resnet18", 40000.0, phase_at=0.2, phase_to="vgg16"),
            SimJob(2, 20000.0, "vgg16", 10000.0)]
    static, _ = _run(jobs, "iadeep-static")
    adaptive, ap = _run(jobs, "iadeep")
    assert static.shared_frac == 1.0
    assert ap.hooks.refreshes == 1 and adaptive.shared_frac == 0.0
    assert sum(adaptive.jcts) < sum(static.jcts)


def test_iadeep_refreshes_a_job_that_changes_phase_while_sharing():
    """Two mlp jobs share the one GPU from the start; job 1 becomes vgg16 (utilisation alone
    97% against mlp's 11%) and ends while job 2 still runs, so it is never alone: only its
    own SM share over its speed (``solo_util``) can show the change, and it does. With phase
    refreshes off, nothing is refreshed."""
    jobs = [SimJob(1, 0.0, "mlp", 40000.0, phase_at=0.2, phase_to="vgg16"),
            SimJob(2, 0.0, "mlp", 200000.0)]
    adaptive, ap = _run(jobs, "iadeep")
    assert adaptive.shared_frac == 1.0 and adaptive.jcts[0] < adaptive.jcts[1]
    assert ap.hooks.refreshes == 1
    off = Policy(adapt=AdaptPolicy(phase=False))
    _, quiet = _run(jobs, "iadeep", policy=off)
    assert quiet.hooks.refreshes == 0


def test_without_phase_shifts_the_adaptive_policy_changes_nothing():
    # pairs only: every group is as predicted, so the jitter of the observations finds nothing
    pairs = Policy(max_jobs_per_gpu=2, min_speed=0.5)
    jobs = generate_jobs(sorted(TRUTH.workloads() & set(PROFILES)), 120, 4, 1.2, 3)
    static, _ = _run(jobs, "iadeep-static", gpus=4, policy=pairs)
    adaptive, ap = _run(jobs, "iadeep", gpus=4, policy=pairs)
    assert ap.hooks.suspensions == ap.hooks.refreshes == 0
    assert adaptive.jcts == pytest.approx(static.jcts)


def test_without_phase_shifts_adaptation_acts_only_on_real_findings():
    # groups of three (the default): when the light third job of a group ends, the two heavy
    # ones it was placed with may remain, really worse than serial (their predicted speeds
    # were the group's); suspending one of them is a real finding and it does not cost
    jobs = generate_jobs(sorted(TRUTH.workloads() & set(PROFILES)), 120, 4, 1.2, 3)
    static, _ = _run(jobs, "iadeep-static", gpus=4, policy=ALL_ACTIONS)
    adaptive, ap = _run(jobs, "iadeep", gpus=4, policy=ALL_ACTIONS)
    assert ap.hooks.refreshes == 0
    assert sum(adaptive.jcts) <= sum(static.jcts) * 1.01


def test_without_phase_shifts_the_default_adaptation_changes_nothing():
    """The defaults (groups of three, only the phase refresh acts): without phase shifts there
    is nothing to refresh, so the schedule is static's to the second, though the same trace
    with every action on suspends jobs of groups that a light third job left behind."""
    jobs = generate_jobs(sorted(TRUTH.workloads() & set(PROFILES)), 120, 4, 1.2, 3)
    static, _ = _run(jobs, "iadeep-static", gpus=4)
    adaptive, ap = _run(jobs, "iadeep", gpus=4)
    assert ap.hooks.suspensions == ap.hooks.refreshes == 0
    assert adaptive.jcts == pytest.approx(static.jcts)
    _, every = _run(jobs, "iadeep", gpus=4, policy=ALL_ACTIONS)
    assert every.hooks.suspensions > 0


def test_phase_shifts_choose_the_fraction_and_window_and_keep_the_trace():
    names = sorted(TRUTH.workloads() & set(PROFILES))
    jobs = generate_jobs(names, 200, 8, 1.0, 1)
    shifted = add_phase_shifts(jobs, names, 0.3, 1)
    moved = [j for j in shifted if j.phase_to]
    assert len(moved) == 60
    assert all(0.2 <= j.phase_at <= 0.8 and j.phase_to != j.workload for j in moved)
    assert [(j.submit_s, j.workload, j.duration_s) for j in shifted] == \
        [(j.submit_s, j.workload, j.duration_s) for j in jobs]
    assert add_phase_shifts(jobs, names, 0.0, 1) == jobs
    with pytest.raises(InputError):
        add_phase_shifts(jobs, names, 1.5, 1)


@pytest.mark.parametrize("bad", ["1.5", "-0.1"])
def test_cli_rejects_a_bad_phase_shift_with_one_line(bad):
    out = subprocess.run([*IADEEP, "sim", "--jobs", "5", "--phase-shift", bad],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"Error: --phase-shift must be a fraction between 0 and 1, got "
                               f"{bad} (hint: e.g. --phase-shift 0.3")


def test_cli_phase_shift_with_both_policies():
    out = subprocess.run([*IADEEP, "sim", "--jobs", "60", "--phase-shift", "0.5", "--policies",
                                   "exclusive,iadeep-static,iadeep"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "iadeep-static" in out.stdout and "phase shift 0.5" in out.stdout


def test_a_closed_gpu_reopens_as_soon_as_its_jobs_change():
    """The adaptive hooks close a GPU whose pair underperforms (at polls), and open it again at
    the very event where a partner leaves, not a virtual minute later."""
    from iadeep_cli.jobs import Job, JobSpec, JobState
    from iadeep_cli.sim.adaptive import AdaptHooks
    from iadeep_cli.sim.engine import _Phases

    hooks = AdaptHooks(PROFILES, AdaptPolicy(stop_partners=True, observe_s=0, polls=2), seed=0)
    running = {i: Job(i, "sim", JobSpec("sim", workload="resnet18"), JobState.RUNNING, 0.0,
                      node="n0", gpu_indices=(0,), started_at=float(i)) for i in (1, 2)}
    phases = _Phases([SimJob(i, 0.0, "resnet18", 1e5) for i in (1, 2)])
    hooks.placed({1: 0.9, 2: 0.9})
    on_gpu = {("n0", 0): [1, 2], ("n0", 1): []}
    for t in (60.0, 120.0):
        hooks.next_poll(t - 1)
        hooks.step(t, running, on_gpu, phases, {1: 0.5, 2: 0.5})
    assert list(hooks.closed) == ["n0:0"]
    assert hooks.step(130.0, running, on_gpu, phases, {1: 0.5, 2: 0.5}) is False   # no news
    # the next poll finds the same GPU closed (its reason now says for how long): no news either
    hooks.next_poll(179.0)
    assert hooks.step(180.0, running, on_gpu, phases, {1: 0.5, 2: 0.5}) is False
    assert list(hooks.closed) == ["n0:0"]
    del running[2]
    on_gpu[("n0", 0)] = [1]
    assert hooks.step(140.0, running, on_gpu, phases, {1: 1.0}) is True
    assert hooks.closed == {}


@pytest.mark.parametrize("policy", [ALL_ACTIONS, Policy()], ids=["every action", "defaults"])
def test_quiet_polls_only_draw_and_the_schedule_is_the_one_of_polling_every_minute(policy):
    """After a poll whose outcome no jitter could change, iadeep's next polls in the same
    state only draw their random numbers: with phase shifts refreshed (and, every action on,
    suspensions and closed GPUs; with the defaults the sharing detector's findings act on
    nothing, so they do not keep a poll from being quiet), the results are those of running
    every poll in full."""
    names = sorted(TRUTH.workloads() & set(PROFILES))
    jobs = add_phase_shifts(generate_jobs(names, 40, 2, 1.2, 1), names, 0.3, 1)
    runs = []
    for skip in (False, True):
        planner = make_planner("iadeep", PROFILES, TRUTH, TRUTH, policy,
                               {j.id: 0.0 for j in jobs}, 0)
        planner.hooks.skip_quiet = skip
        r = simulate(jobs, planner, TRUTH, gpus=2, profiles=PROFILES, name="iadeep",
                     policy=policy)
        runs.append((r, planner.hooks.refreshes, planner.hooks.suspensions,
                     planner.hooks.skipped))
    (full, *acts_full, none), (quick, *acts_quick, skipped) = runs
    assert none == 0 and skipped > 1000          # most polls were quiet
    assert acts_full[0] > 0                      # and the adaptation did act
    assert (acts_full[1] > 0) == policy.adapt.suspend
    assert quick == full and acts_quick == acts_full

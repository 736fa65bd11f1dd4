"""Real traces in the simulator: the Philly and sacct readers, windows and parts, bad rows,
gangs of whole nodes, queue wait under preemption, and --seeds over a trace."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from iadeep_cli.errors import InputError
from iadeep_cli.inventory import Policy
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles, shipped_triples
from iadeep_cli.scheduler.inputs import PlanInputs
from iadeep_cli.scheduler.placement import GpuSlot, plan
from iadeep_cli.scheduler.priority import RankedQueue
from iadeep_cli.sim.engine import PREEMPT_COST_S, SimJob, make_planner, simulate
from iadeep_cli.sim.run import SimSettings, run_seeds, run_sim
from iadeep_cli.sim.traces import (
    PHILLY,
    SACCT,
    TraceWindow,
    assign_workloads,
    read_trace,
)
from iadeep_cli.sim.truth import TruthModel

PROFILES = shipped_profiles()
TRUTH = TruthModel(shipped_pairs(), shipped_triples())
IADEEP = [str(Path(sys.executable).parent / "iadeep")]
PHILLY_FILE = Path("/work/shared/data/traces/philly-2017-sep-nov-dec.csv.gz")
PHILLY_HEAD = "timestamp,duration,num_gpus,gpu_time,cluster\n"
SACCT_HEAD = "JobID|User|JobName|Partition|Account|Submit|Start|End|State|AllocTRES|ReqTRES\n"


def cli(*args):
    return subprocess.run(IADEEP + list(args), capture_output=True, text=True, timeout=240)


def _philly(tmp_path: Path, rows: list[str], gz: bool = True) -> Path:
    text = PHILLY_HEAD + "".join(r + "\n" for r in rows)
    if gz:
        path = tmp_path / "philly.csv.gz"
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path = tmp_path / "philly.csv"
        path.write_text(text)
    return path


def _sacct(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "sacct.txt"
    path.write_text(SACCT_HEAD + "".join(r + "\n" for r in rows))
    return path


PHILLY_ROWS = [
    "2017-11-01 10:00:00,3600.0,1,3600.0,aaa111",
    "2017-11-01 09:00:00,7200.0,2,14400.0,bbb222",   # unsorted, as the extract is
    "2017-11-02 09:00:00,60.0,8,480.0,aaa111",
    "2017-11-03 12:30:00,600.0,16,9600.0,aaa111",
]


# --------------------------------------------------------------------------- Philly
def test_philly_rows_keep_times_gpus_and_team_as_user_and_the_window_starts_at_zero(tmp_path):
    tr = read_trace(_philly(tmp_path, PHILLY_ROWS), PROFILES)
    assert tr.format == PHILLY and not tr.has_workloads
    assert [(j.id, j.submit_s, j.duration_s, j.gpus, j.user) for j in tr.jobs] == [
        (1, 0.0, 7200.0, 2, "bbb222"), (2, 3600.0, 3600.0, 1, "aaa111"),
        (3, 86400.0, 60.0, 8, "aaa111"), (4, 2 * 86400.0 + 3.5 * 3600, 600.0, 16, "aaa111")]
    assert tr.start_text == "2017-11-01 09:00:00"


def test_a_plain_philly_csv_reads_as_the_gzip_one_does(tmp_path):
    a = read_trace(_philly(tmp_path, PHILLY_ROWS, gz=False), PROFILES)
    b = read_trace(_philly(tmp_path, PHILLY_ROWS), PROFILES)
    assert a.jobs == b.jobs


def test_a_window_a_team_and_every_kth_job_take_their_part_shifted_to_zero(tmp_path):
    path = _philly(tmp_path, PHILLY_ROWS)
    win = read_trace(path, PROFILES, TraceWindow(start="2017-11-02", days=1))
    assert [(j.submit_s, j.gpus) for j in win.jobs] == [(9 * 3600.0, 8)]
    assert win.days == 1 and win.start_text == "2017-11-02 00:00:00"
    team = read_trace(path, PROFILES, TraceWindow(team="aaa111"))
    assert [j.gpus for j in team.jobs] == [1, 8, 16] and team.jobs[0].submit_s == 0.0
    every = read_trace(path, PROFILES, TraceWindow(every=2))
    assert [j.gpus for j in every.jobs] == [2, 8]
    by_days = read_trace(path, PROFILES, TraceWindow(start="1", days=0.5))
    assert [j.gpus for j in by_days.jobs] == [8]   # days after the first job: 11-02 09:00


def test_an_unknown_team_names_the_teams_there(tmp_path):
    with pytest.raises(InputError) as e:
        read_trace(_philly(tmp_path, PHILLY_ROWS), PROFILES, TraceWindow(team="zzz"))
    assert "no job of team 'zzz'" in e.value.message and "aaa111 (3 jobs)" in e.value.hint


@pytest.mark.parametrize("row, col, what", [
    ("2017-11-01 10:00:00,3600.0,1.7,6120.0,aaa", "num_gpus", "whole number of GPUs"),
    ("yesterday,3600.0,1,3600.0,aaa", "timestamp", "date and time"),
    ("2017-11-01 10:00:00,-5,1,3600.0,aaa", "duration", ">= 0"),
    ("2017-11-01 10:00:00,abc,1,3600.0,aaa", "duration", "expected a number"),
])
def test_a_bad_philly_row_is_one_error_naming_file_line_and_column(tmp_path, row, col, what):
    path = _philly(tmp_path, [PHILLY_ROWS[0], row])
    with pytest.raises(InputError) as e:
        read_trace(path, PROFILES)
    assert e.value.message.startswith(f"{path}:3: {col}:") and what in e.value.message
    assert e.value.hint


def test_fractional_gpus_are_refused_on_the_command_line_not_cut(tmp_path):
    path = _philly(tmp_path, [PHILLY_ROWS[0], "2017-11-01 10:00:00,3600.0,1.7,6120.0,aaa"])
    r = cli("sim", "--trace", str(path), "--policies", "exclusive")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{path}:3: num_gpus: expected a whole number of GPUs, got '1.7'" in r.stderr


def test_the_simulators_own_csv_refuses_fractional_gpus_too(tmp_path):
    path = tmp_path / "own.csv"
    path.write_text("submit_s,workload,duration_s,gpus\n0,resnet50,60,1.7\n")
    with pytest.raises(InputError, match=r"own.csv:2: gpus: expected a whole number"):
        read_trace(path, PROFILES)


def test_a_header_of_no_known_format_says_what_headers_are_read(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(InputError) as e:
        read_trace(path, PROFILES)
    assert e.value.message.startswith(f"{path}:1: not a trace header") and "sacct" in e.value.hint


# --------------------------------------------------------------------------- sacct
SACCT_ROWS = [
    "100|alice|train-a|gpu|lab1|2024-03-01T08:00:00|2024-03-01T08:10:00|2024-03-01T10:10:00|"
    "COMPLETED|billing=4,cpu=8,gres/gpu=2,mem=64G,node=1|billing=4,cpu=8,gres/gpu=2",
    "100.batch|||||2024-03-01T08:10:00|2024-03-01T08:10:00|2024-03-01T10:10:00|COMPLETED|"
    "cpu=8,gres/gpu=2|",
    "101_3|bob|sweep|gpu|lab2|2024-03-01T09:00:00|2024-03-01T09:00:05|2024-03-01T09:30:05|"
    "FAILED|cpu=4,gres/gpu:a100=1,mem=8G|",
    "102|carol|cpu-only|cpu|lab1|2024-03-01T09:00:00|2024-03-01T09:00:00|2024-03-01T09:05:00|"
    "COMPLETED|cpu=2,mem=4G|cpu=2",
    "103|dave|never|gpu|lab1|2024-03-01T09:30:00|Unknown|Unknown|CANCELLED by 1001||"
    "gres/gpu=4",
    "104|erin|big|gpu|lab2|2024-03-02T07:00:00|2024-03-02T07:30:00|2024-03-02T19:30:00|"
    "CANCELLED by 1002||cpu=64,gres/gpu=16",
    "105|frank|live|gpu|lab1|2024-03-02T08:00:00|2024-03-02T08:00:00|Unknown|RUNNING|"
    "gres/gpu=1|",
]


def test_sacct_rows_keep_users_names_and_gpus_of_every_tres_form(tmp_path):
    tr = read_trace(_sacct(tmp_path, SACCT_ROWS), PROFILES)
    assert tr.format == SACCT
    assert [(j.user, j.name, j.gpus, j.duration_s) for j in tr.jobs] == [
        ("alice", "train-a", 2, 7200.0), ("bob", "sweep", 1, 1800.0),
        ("erin", "big", 16, 12 * 3600.0)]
    assert tr.jobs[0].submit_s == 0.0 and tr.jobs[1].submit_s == 3600.0
    # steps are not jobs; the rest is counted where it went
    assert tr.left_out == {"held no GPU": 1, "never started": 1, "still running": 1}


def test_a_failed_or_cancelled_job_keeps_the_run_time_it_had(tmp_path):
    tr = read_trace(_sacct(tmp_path, SACCT_ROWS), PROFILES)
    assert {j.name: j.duration_s for j in tr.jobs}["big"] == 12 * 3600.0   # CANCELLED


def test_a_sacct_team_is_its_partition_or_its_account(tmp_path):
    path = _sacct(tmp_path, SACCT_ROWS)
    assert [j.user for j in read_trace(path, PROFILES, TraceWindow(team="lab2")).jobs] == [
        "bob", "erin"]
    assert len(read_trace(path, PROFILES, TraceWindow(team="gpu")).jobs) == 3


def test_sacct_typed_gpus_are_summed_and_the_untyped_total_wins(tmp_path):
    rows = ["1|u|a|p|a|2024-01-01T00:00:00|2024-01-01T00:00:00|2024-01-01T01:00:00|COMPLETED|"
            "gres/gpu:a100=2,gres/gpu:v100=1|",
            "2|u|b|p|a|2024-01-01T00:00:00|2024-01-01T00:00:00|2024-01-01T01:00:00|COMPLETED|"
            "gres/gpu=2,gres/gpu:a100=2|"]
    assert [j.gpus for j in read_trace(_sacct(tmp_path, rows), PROFILES).jobs] == [3, 2]


def test_a_bad_sacct_row_names_file_line_and_field(tmp_path):
    rows = [SACCT_ROWS[0], "7|u|a|p|a|2024-01-01T00:00:00|2024-01-01T00:00:00|"
            "2024-01-01T01:00:00|COMPLETED|gres/gpu=1.5|"]
    path = _sacct(tmp_path, rows)
    with pytest.raises(InputError) as e:
        read_trace(path, PROFILES)
    assert e.value.message == f"{path}:3: AllocTRES: expected a whole number of GPUs, got '1.5'"
    short = tmp_path / "short.txt"
    short.write_text(SACCT_HEAD + "8|u|a\n")
    with pytest.raises(InputError, match=r"short.txt:2: expected 11 fields, got 3"):
        read_trace(short, PROFILES)


def test_a_sacct_export_without_gpus_columns_says_how_to_export_it(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("JobID|User|JobName|Submit|Start|End|State\n")
    with pytest.raises(InputError) as e:
        read_trace(path, PROFILES)
    assert "AllocTRES or ReqTRES" in e.value.message and "--format=" in e.value.hint


# --------------------------------------------------------------------------- workloads, seeds
def test_workloads_are_drawn_per_seed_from_the_profiled_ones():
    jobs = [SimJob(i, float(i), "", 60.0) for i in range(1, 41)]
    a, b = assign_workloads(jobs, ["resnet50", "bert"], 0), assign_workloads(jobs, ["resnet50",
                                                                                   "bert"], 1)
    assert {j.workload for j in a} == {"resnet50", "bert"}
    assert [j.workload for j in a] != [j.workload for j in b]
    assert a == assign_workloads(jobs, ["bert", "resnet50"], 0)   # order of names irrelevant


def test_seeds_over_a_trace_draw_a_workload_assignment_each(tmp_path):
    path = _philly(tmp_path, [f"2017-11-01 00:{2 * m:02d}:00,{3600 + 300 * m}.0,1,0,t"
                              for m in range(12)])
    rep = run_seeds(SimSettings(trace=str(path), gpus=2, policies=("exclusive", "packing")), 3)
    assert rep.seeds == (0, 1, 2) and all(r.n_jobs == 12 for r in rep.runs)
    assert len({r.results[1].avg_jct_s for r in rep.runs}) > 1   # the workloads differ


def test_seeds_refuse_a_trace_that_names_its_workloads(tmp_path):
    path = tmp_path / "own.csv"
    path.write_text("submit_s,workload,duration_s\n0,resnet50,60\n")
    with pytest.raises(InputError, match="names each job's workload"):
        run_seeds(SimSettings(trace=str(path), policies=("exclusive",)), 2)


def test_a_trace_runs_json_reports_the_traces_jobs_window_and_gpus_not_the_generators(
        tmp_path):
    r = cli("sim", "--trace", str(_philly(tmp_path, PHILLY_ROWS)), "--gpus", "16",
            "--policies", "exclusive,iadeep", "--json")
    assert r.returncode == 0, r.stderr
    settings = json.loads(r.stdout)["settings"]
    assert "jobs" not in settings and "load" not in settings
    tr = settings["trace_summary"]
    assert tr["jobs"] == 4 and tr["format"] == "philly" and tr["max_job_gpus"] == 16
    assert tr["window_start"] == "2017-11-01 09:00:00" and tr["cluster_gpus"] == 16
    assert tr["gpu_hours"] == pytest.approx((3600 + 14400 + 480 + 9600) / 3600)


def test_a_job_larger_than_the_cluster_is_left_out_and_counted_not_an_abort(tmp_path):
    rep = run_sim(SimSettings(trace=str(_philly(tmp_path, PHILLY_ROWS)), gpus=8,
                              policies=("exclusive",)))
    assert rep.n_jobs == 3 and rep.trace is not None
    assert rep.trace["left_out"] == {"needs more GPUs than the cluster has": 1}


def test_trace_options_without_a_trace_are_refused():
    r = cli("sim", "--trace-days", "3")
    assert r.returncode == 1 and "add --trace FILE" in r.stderr


@pytest.mark.skipif(not PHILLY_FILE.exists(), reason="the shared Philly extract is not here")
def test_a_slice_of_the_real_philly_extract_replays_under_every_default_policy():
    s = SimSettings(trace=str(PHILLY_FILE), gpus=16, trace_start="2017-11-07",
                    trace_days=0.5, trace_team="6c71a0")
    rep = run_sim(s)
    assert rep.n_jobs > 10 and rep.trace is not None and rep.trace["format"] == "philly"
    assert all(len(r.jcts) == rep.n_jobs for r in rep.results)


# --------------------------------------------------------------------------- gangs
def _slots(nodes: int, busy: dict[tuple[str, int], int] | None = None) -> tuple[GpuSlot, ...]:
    busy = busy or {}
    return tuple(GpuSlot(f"n{k}", i, 143771.0, 143771.0 if (f"n{k}", i) not in busy else 1e5,
                         (busy[(f"n{k}", i)],) if (f"n{k}", i) in busy else (), 1)
                 for k in range(nodes) for i in range(8))


def _queued(i: int, gpus: int) -> Job:
    return Job(i, "u", JobSpec("sim", workload="resnet50", gpus=gpus), JobState.QUEUED, 0.0)


def _running(busy: dict[tuple[str, int], int]) -> list[Job]:
    return [Job(i, "u", JobSpec("sim", workload="resnet50"), JobState.RUNNING, 0.0, node=n,
                gpu_indices=(g,), started_at=0.0) for (n, g), i in busy.items()]


def test_plan_places_a_sixteen_gpu_job_on_two_whole_empty_nodes():
    busy = {("n0", 3): 9}
    p = plan([_queued(1, 16)], _slots(3, busy), _running(busy), 0.0,
             PlanInputs(PROFILES, TRUTH, Policy(), gangs=True))
    (got,) = p.placements
    assert sorted(got.gpu_keys()) == [(n, i) for n in ("n1", "n2") for i in range(8)]


def test_a_gang_waits_while_only_one_node_is_whole_and_plan_without_gangs_never_places_it():
    busy = {("n0", 3): 9, ("n1", 0): 8}
    p = plan([_queued(1, 16)], _slots(3, busy), _running(busy), 0.0,
             PlanInputs(PROFILES, TRUTH, Policy(), gangs=True))
    assert not p.placements and "1 node wholly free" in p.waits[1]
    p = plan([_queued(1, 16)], _slots(3), [], 0.0,
             PlanInputs(PROFILES, TRUTH, Policy()))
    assert not p.placements and "on one node" in p.waits[1]


@pytest.mark.parametrize("policy", ["exclusive", "packing", "random", "tiresias", "gandiva",
                                    "lucid", "iadeep", "oracle"])
def test_a_sixteen_gpu_job_on_eight_gpu_nodes_completes_as_a_gang_under(policy):
    # one 1-GPU job holds a node for an hour; the 16-GPU job waits for two whole nodes
    jobs = [SimJob(1, 0.0, "resnet50", 3600.0), SimJob(2, 10.0, "bert", 600.0, gpus=16),
            SimJob(3, 20.0, "resnet50", 100.0)]
    mem = {j.id: 0.0 for j in jobs}
    planner = make_planner(policy, PROFILES, TRUTH, TRUTH, Policy(), mem, 0)
    r = simulate(jobs, planner, TRUTH, gpus=16, profiles=PROFILES, name=policy)
    jct = dict(zip((1, 2, 3), r.jcts))
    assert len(r.jcts) == 3
    assert jct[2] == pytest.approx(3600.0 - 10.0 + 600.0, abs=1.0)   # after job 1 ends
    assert jct[3] == pytest.approx(100.0, abs=1.0)   # the small job is not held behind it
    # the gang's 16 GPUs were busy for its 600 s: busy time counts them all
    assert r.gpu_busy * 16 * r.makespan_s >= 16 * 600.0 - 1.0


# --------------------------------------------------------------------------- queue wait
def test_queue_wait_counts_the_time_a_preempted_job_spends_off_its_gpu():
    # tiresias: job 1 runs alone past its 1 GPU-hour, job 2 arrives and preempts it
    jobs = [SimJob(1, 0.0, "resnet50", 7200.0), SimJob(2, 5000.0, "resnet50", 1000.0)]
    mem = {j.id: 0.0 for j in jobs}
    planner = make_planner("tiresias", PROFILES, TRUTH, TRUTH, Policy(), mem, 0)
    r = simulate(jobs, planner, TRUTH, gpus=1, profiles=PROFILES, name="tiresias")
    assert r.preemptions == 1
    assert r.waits == pytest.approx((1000.0, 0.0))   # job 1 off its GPU 5000 s .. 6000 s
    # its 7200 s of work, 1000 s off its GPU, and the preemption's cost redone on it
    assert r.jcts[0] == pytest.approx(8200.0 + PREEMPT_COST_S)


# --------------------------------------------------------------------------- speed, same plans
@pytest.mark.parametrize("seed", range(6))
def test_a_round_without_reasons_places_exactly_what_the_full_round_places(seed):
    """plan(reasons=False), the simulator's round, stops when no GPU has room, looks ahead
    only as far as pressure needs and passes over jobs like one that could not start: the
    placements must be those of the full round the controller runs, on crowded and on
    roomy clusters, with multi-GPU jobs, gangs, exclusive jobs and a reservation due."""
    import random as rnd
    rng = rnd.Random(seed)
    names = sorted(PROFILES)
    slots, active, next_id = [], [], 1000
    for k in range(4):
        for i in range(8):
            here = []
            for _ in range(rng.choice([0, 0, 1, 1, 1, 2])):
                next_id += 1
                here.append(next_id)
                active.append(Job(next_id, "u", JobSpec("sim", workload=rng.choice(names)),
                                  JobState.RUNNING, 0.0, node=f"n{k}", gpu_indices=(i,),
                                  started_at=0.0))
            slots.append(GpuSlot(f"n{k}", i, 143771.0, 143771.0 - 30000.0 * len(here),
                                 tuple(here), 2))
    queue = [Job(j, f"u{j % 3}", JobSpec("sim", workload=rng.choice(names),
                                         gpus=rng.choice([1, 1, 1, 1, 2, 8, 16]),
                                         exclusive=rng.random() < 0.1),
                 JobState.QUEUED, float(rng.randrange(0, 20000)))
             for j in range(1, 301)]
    args = (queue, tuple(slots), active, 30000.0)
    full = plan(*args, PlanInputs(PROFILES, TRUTH, Policy(), gangs=True))
    fast = plan(*args, PlanInputs(PROFILES, TRUTH, Policy(), gangs=True, reasons=False))
    assert fast.placements == full.placements
    assert set(fast.waits) <= set(full.waits)
    # the queue kept ranked, as the simulator's engine hands it (RankedQueue): the round
    # also stops once every alike job still to come is like one that could not start
    ranked = plan(RankedQueue(queue), *args[1:],
                  PlanInputs(PROFILES, TRUTH, Policy(), gangs=True, reasons=False))
    assert ranked.placements == fast.placements and ranked.preempt == fast.preempt
    assert set(ranked.waits) <= set(fast.waits)

"""Self-tuning's parts: the lab's trace from its database, the candidates, the what-if replay,
adoption with hysteresis, pinned keys and ``self_tune: false``, and `iadeep sim
--trace-from-db` / `iadeep tune` on a real SQLite database."""
from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from iadeep_cli.controller.round.steps import tune
from iadeep_cli.errors import ConfigError
from iadeep_cli.inventory import parse_inventory
from iadeep_cli.jobs import JobSpec
from iadeep_cli.model.data import shipped_profiles
from iadeep_cli.settings import Policy
from iadeep_cli.sim import whatif
from iadeep_cli.store import Store, cluster, jobrows

LIGHT = ("mlp", "resnet18", "lstm")
NOW = 1_800_000_000.0


def _job(conn, workload, submit, start, end, *, gpus=1, state="succeeded", owner="alice",
         work_s=None):
    job_id, _ = jobrows.insert(conn, owner, JobSpec(script="/bin/true", workload=workload,
                                                     gpus=gpus), submit)
    jobrows.update(conn, job_id, state=state, started_at=start, ended_at=end)
    if work_s is not None:
        conn.execute("UPDATE jobs SET work_s=? WHERE id=?", (work_s, job_id))
    return job_id


def _history(conn, n=60, seed=7):
    """``n`` light jobs of the last two days, run one at a time on one GPU."""
    rng = random.Random(seed)
    t = free = NOW - 2 * 86400
    for i in range(n):
        t += rng.expovariate(1 / 1200.0)
        run = min(4 * 3600.0, max(300.0, rng.lognormvariate(7.5, 0.8)))
        start = max(t, free)
        free = start + run
        _job(conn, LIGHT[i % 3], t, start, free)


def _gpus(conn, n):
    from iadeep_cli.snapshot import GpuSample, NodeSnapshot

    gpus = tuple(GpuSample(index=i, uuid=f"GPU-{i}", name="NVIDIA H200", memory_total_mib=143771,
                           memory_used_mib=0, utilization_gpu=0) for i in range(n))
    cluster.save_nodes(conn, (NodeSnapshot("node01", NOW, gpus, jobs=()),))


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "iadeep.db")
    yield s
    s.close()


def test_lab_trace_takes_solo_time_from_accounted_work_and_counts_what_it_leaves_out(store):
    with store.tx() as conn:
        _job(conn, "mlp", NOW - 100, NOW - 90, NOW - 10, work_s=40.0)   # shared: 80 s wall
        _job(conn, "vgg16", NOW - 80, NOW - 80, NOW - 20, gpus=2, work_s=100.0, owner="bob")
        _job(conn, "lstm", NOW - 70, NOW - 60, NOW - 30)                 # nothing accounted
        _job(conn, "mystery", NOW - 60, NOW - 50, NOW - 40)              # no profile
        _job(conn, "mlp", NOW - 50, None, None, state="queued")
        _job(conn, "mlp", NOW - 5000, NOW - 4000, NOW - 3000)            # before the window
        trace = whatif.lab_trace(conn, NOW - 1000, NOW, shipped_profiles())
    assert [(j.submit_s, j.workload, j.duration_s, j.gpus, j.user) for j in trace.jobs] == [
        (0.0, "mlp", 40.0, 1, "alice"), (20.0, "vgg16", 50.0, 2, "bob"),
        (30.0, "lstm", 30.0, 1, "alice")]
    assert trace.left_out == {"without a profiled workload": 1, "not ended yet": 1}


def _busy_history(conn, n):
    """``n`` light jobs submitted a minute apart, each run for ten minutes as it came."""
    rows = [(LIGHT[i % 3], NOW - (n - i) * 60.0) for i in range(n)]
    for workload, submit in rows:
        _job(conn, workload, submit, submit, submit + 600.0)


def test_the_replay_takes_only_the_newest_jobs_of_a_busy_window(store):
    """A lab that ran many more jobs in tune_days than the replay can take (its simulation's
    cost grows about with the square of the jobs: 10,000 jobs took 639 s, 20,000 never ended
    within the 30-minute cap): the replay is given the newest MAX_REPLAY_JOBS, the rest
    counted as left out, however long the history."""
    cap = whatif.MAX_REPLAY_JOBS
    with store.tx() as conn:
        _busy_history(conn, cap + 500)
        trace = whatif.lab_trace(conn, NOW - 14 * 86400, NOW, shipped_profiles(), 100)
    assert len(trace.jobs) == 100 and trace.left_out == {
        "older than the newest 100": cap + 400}
    assert trace.jobs[-1].submit_s == 99 * 60.0          # the newest, a minute apart
    table = whatif.replay(store, Policy(), 14, NOW)       # (no GPUs yet: no simulation)
    assert table["jobs"] == cap and f"500 older than the newest {cap}" in table["trace"]
    with store.tx() as conn:
        _gpus(conn, 2)
    small = whatif.replay(store, Policy(), 14, NOW, max_jobs=60)   # simulated: 60 jobs
    assert small["jobs"] == 60 and len(small["outcomes"]) == len(whatif.candidates(Policy()))


def test_candidates_hold_pinned_keys_and_count_exclusive_once():
    free = whatif.candidates(Policy())
    assert len(free) == 9   # 1/GPU once + 2 x 2 floors x 2 rules
    assert free[0] == Policy()
    pinned = whatif.candidates(replace(Policy(), max_jobs_per_gpu=2,
                                       pinned=("max_jobs_per_gpu",)))
    assert {p.max_jobs_per_gpu for p in pinned} == {2} and len(pinned) == 4
    all_pinned = replace(Policy(), pinned=("max_jobs_per_gpu", "min_speed", "sharing"))
    assert whatif.candidates(all_pinned) == [all_pinned]


def _table(store, policy):
    return whatif.replay(store, policy, 14, NOW)


def test_replay_of_a_busy_light_history_favours_three_per_gpu(store):
    with store.tx() as conn:
        _history(conn)
        _gpus(conn, 1)
    table = _table(store, replace(Policy(), max_jobs_per_gpu=1))
    by = {o["label"]: o for o in table["outcomes"]}
    assert table["jobs"] == 60 and table["gpus"] == 1
    assert table["best"]["max_jobs_per_gpu"] == 3
    assert by["1/GPU (exclusive)"]["avg_jct_s"] > 2 * by[whatif.label(table["best"])][
        "avg_jct_s"]
    assert all(o["p95_jct_s"] >= o["avg_jct_s"] * 0.5 and o["p95_wait_s"] >= o["avg_wait_s"]
               for o in table["outcomes"])
    choice, why = tune.verdict(table)
    assert choice == table["best"] and "cuts the average JCT" in why


def _fake_table(in_force, best_settings, gain):
    rows = [{"settings": in_force, "avg_jct_s": 1000.0, "p95_jct_s": 1.0, "avg_wait_s": 0.0,
             "p95_wait_s": 0.0}]
    if best_settings != in_force:
        rows.append({"settings": best_settings, "avg_jct_s": 1000.0 * (1 - gain),
                     "p95_jct_s": 1.0, "avg_wait_s": 0.0, "p95_wait_s": 0.0})
    return {"at": NOW, "in_force": in_force, "best": best_settings, "outcomes": rows}


ONE = {"max_jobs_per_gpu": 1, "min_speed": 0.3, "sharing": "threshold"}
THREE = {"max_jobs_per_gpu": 3, "min_speed": 0.3, "sharing": "threshold"}
TWO = {"max_jobs_per_gpu": 2, "min_speed": 0.5, "sharing": "jct"}


def _inventory(policy_yaml=""):
    return parse_inventory(f"lab:\n  policy:\n    tune_days: 7\n{policy_yaml}nodes: []\n",
                           "nodes.yaml")


def test_adoption_needs_the_same_clear_winner_twice_in_a_row(store):
    inv = _inventory("    max_jobs_per_gpu: 1\n    self_tune: true\n")
    inv = replace(inv, policy=replace(inv.policy, pinned=()))   # 1 given, but not pinned
    st = tune.SelfTuning(store, NOW)
    assert st.applied(inv) is inv
    st._decide(_fake_table(ONE, THREE, 0.02), inv)        # below the margin
    assert st.record["proposal"] is None and "adopted" not in st.record
    st._decide(_fake_table(ONE, THREE, 0.10), inv)        # once
    assert st.record["streak"] == 1 and st.applied(inv) is inv
    st._decide(_fake_table(ONE, TWO, 0.10), inv)          # another winner: starts again
    assert st.record["streak"] == 1 and st.record["proposal"] == TWO
    st._decide(_fake_table(ONE, THREE, 0.10), inv)
    st._decide(_fake_table(ONE, THREE, 0.10), inv)        # twice in a row: adopted
    assert st.record["adopted"] == THREE and st.record["history"][-1]["settings"] == THREE
    assert st.applied(inv).policy.max_jobs_per_gpu == 3
    with store.read() as conn:   # recorded, and read back by a restarted controller
        assert cluster.get_meta(conn, tune.META)["adopted"] == THREE
    again = tune.SelfTuning(store, NOW)
    assert again.applied(inv).policy.max_jobs_per_gpu == 3


def test_pinned_keys_and_self_tune_off_keep_nodes_yaml(store):
    with store.tx() as conn:
        cluster.set_meta(conn, tune.META, {"adopted": TWO})
    st = tune.SelfTuning(store, NOW)
    pinned = _inventory("    max_jobs_per_gpu: 3\n")
    assert pinned.policy.pinned == ("max_jobs_per_gpu",)
    got = st.applied(pinned).policy
    assert (got.max_jobs_per_gpu, got.min_speed, got.sharing) == (3, 0.5, "jct")
    off = _inventory("    self_tune: false\n")
    assert st.applied(off) is off
    st.step(NOW + 10 * 86400, off)   # off: never replays
    assert st._thread is None


def test_inventory_rejects_bad_tuning_settings():
    with pytest.raises(ConfigError, match="tune_every"):
        parse_inventory("lab:\n  policy:\n    tune_every: 0\nnodes: []\n", "nodes.yaml")
    with pytest.raises(ConfigError, match="self_tune"):
        parse_inventory("lab:\n  policy:\n    self_tune: maybe\nnodes: []\n", "nodes.yaml")
    inv = parse_inventory("lab:\n  policy:\n    tune_every: 2h\n    sharing: jct\nnodes: []\n",
                          "nodes.yaml")
    assert inv.policy.tune_every_s == 7200 and inv.policy.pinned == ("sharing",)


def test_the_replay_child_writes_its_table_and_cpu(store, tmp_path):
    with store.tx() as conn:
        _history(conn, n=24)
        _gpus(conn, 2)
    out = tmp_path / "replay.json"
    policy = json.dumps(tune.policy_to_json(Policy()))
    subprocess.run([sys.executable, "-m", "iadeep_cli.sim.whatif", "--db", str(store.path),
                    "--out", str(out), "--days", "14", "--now", repr(NOW), "--policy", policy],
                   check=True, capture_output=True, timeout=600)
    table = json.loads(out.read_text())
    assert table["jobs"] == 24 and len(table["outcomes"]) == 9 and table["cpu_s"] > 0


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    import os
    env = {**os.environ, "IADEEP_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "iadeep_cli", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_sim_trace_from_db_replays_and_exports_the_lab_history(tmp_path):
    import time
    home = tmp_path / "state"
    home.mkdir()
    s = Store(home / "iadeep.db")
    shift = time.time() - NOW   # the history ends now
    with s.tx() as conn:
        _history(conn, n=30)
        conn.execute("UPDATE jobs SET submitted_at = submitted_at + ?, started_at = started_at "
                     "+ ?, ended_at = ended_at + ?", (shift, shift, shift))
        _gpus(conn, 2)
    s.close()
    out = tmp_path / "lab.csv"
    done = _cli(home, "sim", "--trace-from-db", "--days", "3", "--save-trace", str(out),
                "--policies", "exclusive,iadeep", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["settings"]["gpus"] == 2 and report["settings"]["jobs_simulated"] == 30
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert len(rows) == 30 and rows[0]["submit_s"] == "0.0" and rows[0]["workload"] == "mlp"
    assert {r["user"] for r in rows} == {"alice"}
    # the exported file is a --trace like any other
    again = _cli(home, "sim", "--trace", str(out), "--gpus", "2", "--policies",
                 "exclusive,iadeep", "--json")
    assert again.returncode == 0, again.stderr
    bad = _cli(home, "sim", "--trace-from-db", "--trace", str(out))
    assert bad.returncode != 0 and "cannot be combined with --trace" in bad.stderr
    assert "Traceback" not in bad.stderr
    shown = _cli(home, "tune", "--days", "3")
    assert shown.returncode == 0, shown.stderr
    assert "In force: 3/GPU, floor 0.3, threshold" in shown.stdout
    assert "30 jobs" in shown.stdout and "1/GPU (exclusive)" in shown.stdout


def _oom_pairs(store, owner: str, n: int = 10) -> None:
    """``n`` pairs of ``owner``'s light jobs recorded as the controller records a job that ran
    out of GPU memory beside another (``controller/round/steps/oom.learn``): speed 0.05 each."""
    from types import SimpleNamespace

    from iadeep_cli.controller.round.steps import oom
    from iadeep_cli.jobs import Job, JobState

    def job(job_id: int, workload: str) -> Job:
        return Job(id=job_id, owner=owner, spec=JobSpec(script="/x.sh", workload=workload),
                   state=JobState.RUNNING, submitted_at=NOW - 120, node="node01",
                   gpu_indices=(0,), started_at=NOW - 60)

    loop = SimpleNamespace(store=store)   # what learn uses of the controller: its store
    for i in range(n):
        assert oom.learn(loop, job(1000 + 2 * i, LIGHT[i % 3]),
                         [job(1001 + 2 * i, LIGHT[(i + i // 3) % 3])], NOW) == 1


def _prediction(store) -> tuple[float, float]:
    """What the model the replay fits on the lab's rows predicts for mlp beside resnet18."""
    profiles, _, model = whatif.lab_inputs(store, None, set(LIGHT))
    p = model.predict_pair(profiles["mlp"], profiles["resnet18"])
    return round(p.speed_a, 3), round(p.speed_b, 3)


def test_ten_fake_out_of_memory_pairs_of_one_member_change_neither_tuning_nor_the_model(store):
    """Issue 41: ten pairs of one member's own jobs "out of memory" made self-tuning adopt one
    job per GPU for the whole lab, and the model predict 0.055 for a pair it predicted at
    0.74 / 1.02. Held as that member's, they change neither."""
    with store.tx() as conn:
        _history(conn)
        _gpus(conn, 1)
    policy = replace(Policy(), max_jobs_per_gpu=1)
    before, predicted = _table(store, policy)["best"], _prediction(store)
    _oom_pairs(store, "mallory")
    assert _table(store, policy)["best"] == before and before["max_jobs_per_gpu"] == 3
    assert _prediction(store) == predicted == (0.74, 1.022)


def test_out_of_memory_pairs_two_members_agree_on_count(store):
    with store.tx() as conn:
        _history(conn)
        _gpus(conn, 1)
    _oom_pairs(store, "mallory")
    _oom_pairs(store, "bob")    # another member's jobs say the same: the lab's now
    assert _table(store, replace(Policy(), max_jobs_per_gpu=1))["best"]["max_jobs_per_gpu"] \
        == 1
    assert _prediction(store) == (0.05, 0.05)

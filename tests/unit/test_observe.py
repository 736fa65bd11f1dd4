"""Online learning: observed speeds from real progress files, co-location rows, precedence.

The progress files are read as a round reads them: by the node's state script (here through
``nvml.local_job_states``, the same shell a remote poll runs), for jobs whose recorded session
leader (a real ``sleep`` here) is alive."""
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from iadeep_cli import messages as m
from iadeep_cli.controller import client
from iadeep_cli.controller.catalog import lab_measurements
from iadeep_cli.controller.round.observer import SpeedObserver
from iadeep_cli.inventory import parse_inventory
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.nodes.gpu import split_sections
from iadeep_cli.nodes.nvml import local_job_states
from iadeep_cli.nodes.poller import NodePool
from iadeep_cli.nodes.shell.jobstate import parse_progress
from iadeep_cli.profiles import CoLocation, Profile
from iadeep_cli.snapshot import ClusterSnapshot, GpuSample, NodeSnapshot
from iadeep_cli.store import Store, profiles as profrows


def _job(job_id, workload, gpu=0):
    return Job(id=job_id, owner="u", spec=JobSpec(script="/x.sh", workload=workload),
               state=JobState.RUNNING, submitted_at=0.0, node="here", gpu_indices=(gpu,))


class _Node:
    """The local node "here" in ``workdir``: a live session leader per job (its pid file), and
    ``poll``: a snapshot with what the state script read of the jobs' progress files."""

    def __init__(self, workdir: Path):
        self.workdir, self.leaders = workdir, []

    def poll(self, snap: ClusterSnapshot, observer: SpeedObserver, jobs) -> ClusterSnapshot:
        for job in jobs:
            d = self.workdir / "jobs" / str(job.id)
            d.mkdir(parents=True, exist_ok=True)
            if not (d / "pid").exists():
                leader = subprocess.Popen(["sleep", "600"], start_new_session=True)
                self.leaders.append(leader)
                (d / "pid").write_text(f"{leader.pid}\n")
        asked = observer.offsets(jobs)
        out = local_job_states(str(self.workdir), [(j.id, None, None) for j in jobs], asked)
        read, covered = parse_progress(split_sections(out)), tuple(sorted(asked))
        nodes = [replace(n, progress=read, progress_asked=covered, jobs=n.jobs or ())
                 if n.name == "here" else n for n in snap.nodes]
        if not any(n.name == "here" for n in nodes):
            nodes.append(NodeSnapshot("here", 0.0, jobs=(), progress=read,
                                      progress_asked=covered))
        return replace(snap, nodes=tuple(nodes))


@pytest.fixture
def here(tmp_path):
    node = _Node(tmp_path)
    yield node
    for leader in node.leaders:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def _progress(workdir: Path, job_id: int, start: float, end: float, per_s: float, first=0):
    d = workdir / "jobs" / str(job_id)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "progress", "a") as f:
        t, it = start, first
        while t <= end:
            f.write(f"{t:.3f} {it}\n")
            t, it = t + 1.0, it + int(per_s)
    return it - int(per_s)


def _resnet50_and_mlp_alone(tmp_path):
    """An observer of the local node, its one-GPU snapshot, resnet50 (job 1, GPU 0) and mlp
    (job 2, GPU 1), and the last iteration each wrote over its first minute alone (10 and 20
    a second)."""
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv))
    snap = ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0, (GpuSample(0, "u", "NVIDIA H200"),)),))
    a, b = _job(1, "resnet50"), _job(2, "mlp", gpu=1)
    last_a = _progress(tmp_path, 1, 0, 60, 10)
    last_b = _progress(tmp_path, 2, 0, 60, 20)
    return observer, snap, a, b, last_a, last_b


def test_shared_speed_is_rate_over_own_solo_rate(tmp_path, here):
    observer, snap, a, b, last_a, last_b = _resnet50_and_mlp_alone(tmp_path)
    # each alone on its GPU
    speeds, rows = observer.observe([a, b], here.poll(snap, observer, [a, b]), now=100.0)
    assert speeds == {1: 1.0, 2: 1.0} and rows == []
    assert observer.solo_rate(1) == 10.0 and observer.solo_rate(2) == 20.0
    b = _job(2, "mlp", gpu=0)   # now they share GPU 0
    last_a = _progress(tmp_path, 1, 100, 200, 6, first=last_a + 6)
    last_b = _progress(tmp_path, 2, 100, 200, 17, first=last_b + 17)
    speeds, rows = observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1000.0)
    assert round(speeds[1], 3) == 0.6 and round(speeds[2], 3) == 0.85
    assert rows == []  # together for less than a minute: not recorded yet
    _progress(tmp_path, 1, 201, 261, 6, first=last_a + 6)
    _progress(tmp_path, 2, 201, 261, 17, first=last_b + 17)
    speeds, rows = observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1061.0)
    assert rows == [CoLocation("NVIDIA H200", ("resnet50", "mlp"), (0.6, 0.85), 1)]
    # one row per pairing
    assert observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1200.0)[1] == []


def test_a_partial_line_waits_for_its_end(tmp_path, here):
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv))
    snap = ClusterSnapshot(0.0, ())
    d = tmp_path / "jobs" / "1"
    d.mkdir(parents=True)
    (d / "progress").write_text("0 0\n10 100\n20 2")
    job = _job(1, "x")
    assert observer.observe([job], here.poll(snap, observer, [job]), 0.0)[0] == {1: 1.0}
    with open(d / "progress", "a") as f:
        f.write("00\n")
    observer.observe([job], here.poll(snap, observer, [job]), 0.0)
    assert observer._tracks[1].points[-1] == (20.0, 200)


def test_lab_measurements_take_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("IADEEP_HOME", str(tmp_path))
    store = Store()
    with store.tx() as conn:
        profrows.upsert_profile(conn, Profile("mlp", 55.0, 10.0, 3.0, "NVIDIA H200"), 5.0,
                                source="job 7")
        profrows.upsert_profile(conn, Profile("mine", 20.0, 5.0, 1.0, "NVIDIA H200"), 5.0)
        profrows.add_colocation(conn, CoLocation("NVIDIA H200", ("mine", "mlp"), (0.9, 0.8)), 6.0)
    store.close()
    views, _ = client.read(m.ProfilesRequest())   # controller down
    by_name = {v.profile.workload: v for v in views}
    assert by_name["mlp"].profile.gpu_util == 55.0 and by_name["mlp"].source == "job 7"
    assert by_name["resnet50"].source.startswith("shipped")
    profiles, pairs = lab_measurements()
    assert set(profiles) == {"mlp", "mine"} and pairs[0].jobs == ("mine", "mlp")


def test_a_stored_speed_no_fit_accepts_is_left_out_and_the_labs_fit_still_runs(tmp_path):
    """A stalled job's 0.0 (or a speed over twice the solo one) stored by an older controller
    must not make every later `iadeep model fit` and refit fail: the row stays in the
    database, the fit leaves it out, the other rows count."""
    env = {**os.environ, "IADEEP_HOME": str(tmp_path)}
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as conn:
        for speeds in ((0.0, 0.85), (0.6, 2.5), (0.7, 0.8)):
            profrows.add_colocation(conn, CoLocation("NVIDIA H200", ("resnet50", "mlp"),
                                                     speeds), 6.0)
    store.close()
    done = subprocess.run([str(Path(sys.executable).parent / "iadeep"), "model", "fit", "-o",
                           str(tmp_path / "m.json")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and (tmp_path / "m.json").exists()
    reader = Store(tmp_path / "iadeep.db", readonly=True)
    assert [p.speeds for p in lab_measurements(reader)[1]] == [(0.7, 0.8)]
    reader.close()


def test_a_newcomer_uses_the_solo_rate_this_lab_profiled(tmp_path, here):
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv))
    snap = ClusterSnapshot(0.0, ())
    _progress(tmp_path, 1, 0, 60, 10)
    _progress(tmp_path, 2, 0, 60, 5)
    jobs = [_job(1, "a"), _job(2, "b")]
    speeds, _ = observer.observe(jobs, here.poll(snap, observer, jobs), 0.0, {"b": 10.0})
    assert speeds == {2: 0.5}  # job 1's workload has no known solo rate: no guess


def _gpu_with(*procs):
    """A snapshot whose GPU 0 holds iadeep processes (job id, sm %)."""
    from iadeep_cli.snapshot import GpuProcess
    processes = tuple(GpuProcess(pid=1000 + j, used_memory_mib=100.0, job_id=j, sm_util=sm)
                      for j, sm in procs)
    gpu = GpuSample(0, "u", "NVIDIA H200", processes=processes)
    return ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0, (gpu,)),))


def test_without_progress_sm_utilisation_is_the_proxy_but_never_a_model_row(tmp_path):
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv))
    a = _job(1, "vgg16")
    assert observer.observe([a], _gpu_with((1, 40.0)), 0.0)[0] == {1: 1.0}   # alone: solo SM
    b = _job(2, "mlp")
    shared = _gpu_with((1, 30.0), (2, 5.0))
    speeds, _ = observer.observe([a, b], shared, 10.0, known_util={"mlp": 10.0})
    assert speeds == {1: 0.75, 2: 0.5}   # b never ran alone: its profile's utilisation
    assert observer.observe([a, b], shared, 100.0, known_util={"mlp": 10.0})[1] == []


def test_no_progress_and_no_sm_figure_means_no_speed(tmp_path):
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv))
    speeds, _ = observer.observe([_job(1, "x"), _job(2, "y")], _gpu_with((1, None), (2, None)),
                                 0.0, known_util={"x": 50.0, "y": 50.0})
    assert speeds == {}


def test_a_round_its_node_missed_keeps_the_solo_rate(tmp_path, here):
    """A slow poll (the node did not answer this round, so its jobs are not observed) must not
    forget a job's solo rate, or the job, sharing from then on, could never be measured; a job
    gone from an answering node is forgotten."""
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv))
    gpus = (GpuSample(0, "u", "NVIDIA H200"),)
    answered = ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0, gpus, jobs=()),))
    silent = ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0, error="no answer"),))
    a, b = _job(1, "resnet50"), _job(2, "mlp")
    last_a = _progress(tmp_path, 1, 0, 60, 10)
    assert observer.observe([a], here.poll(answered, observer, [a]), now=100.0)[0] == {1: 1.0}
    assert observer.observe([], silent, now=110.0) == ({}, [])   # the loop skips its jobs
    assert observer.solo_rate(1) == 10.0
    _progress(tmp_path, 1, 100, 200, 6, first=last_a + 6)
    _progress(tmp_path, 2, 100, 200, 6)
    speeds, _ = observer.observe([a, b], here.poll(answered, observer, [a, b]), now=1000.0)
    assert round(speeds[1], 3) == 0.6 and 2 not in speeds   # b never ran alone
    observer.observe([b], here.poll(answered, observer, [b]), now=1100.0)   # a ended there
    assert observer.solo_rate(1) is None


def _more_jobs_than_reads(tmp_path, count: int):
    """An observer that reads 2 progress files a round; ``count`` running jobs on the local
    node "here", each with 30 s of progress written; a snapshot in which "here" answered."""
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    jobs = [_job(i, "x") for i in range(1, count + 1)]
    for job in jobs:
        _progress(tmp_path, job.id, 0, 30, 10)
    return (SpeedObserver(NodePool(inv), reads_per_node=2), jobs,
            ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0, jobs=()),)))


def test_a_round_reads_a_bounded_number_of_progress_files_per_node_in_turns(tmp_path, here):
    """More running jobs on a node than a round reads: they take turns, the longest unread
    first and a new job before all, so every file is read within a few rounds while a round's
    reads on a node stay bounded; each node has its own budget."""
    observer, jobs, snap = _more_jobs_than_reads(tmp_path, 5)
    elsewhere = [replace(_job(i, "x"), node="other") for i in (10, 11)]
    turns = []
    for now in (1.0, 2.0, 3.0):
        assert {10, 11} <= set(observer.offsets([*jobs, *elsewhere]))   # the other node's two
        polled = here.poll(snap, observer, jobs)
        turns.append(set(polled.nodes[0].progress_asked))   # what the node's poll read
        observer.observe(jobs, polled, now=now)
    assert [len(t) for t in turns] == [2, 2, 2]
    assert set().union(*turns) == {1, 2, 3, 4, 5}   # all five read within 3 rounds
    assert all(observer._tracks[j.id].points for j in jobs)
    assert 6 in observer.offsets([*jobs, _job(6, "x")])   # a newcomer first


def test_a_late_answer_takes_the_turns_it_read_and_no_file_waits_for_good(tmp_path, here):
    """A node that answers a round late answers for the files its own round asked for (it
    started no poll for the next round's choice): turns are taken by what was read, so no file
    is skipped for good, whatever the rhythm of late answers."""
    observer, jobs, snap = _more_jobs_than_reads(tmp_path, 4)
    late = None
    for now in range(1, 9):   # a poll every other round, each answered in the next one
        if late is None:
            late = here.poll(snap, observer, jobs)   # started; its answer comes next round
            observer.observe(jobs, ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0),)), now)
        else:
            observer.offsets(jobs)                    # this round's choice: no poll started
            observer.observe(jobs, late, now)
            late = None
    assert all(observer._tracks[j.id].points for j in jobs)


def test_a_pair_is_recorded_only_from_reads_after_a_full_window_together(tmp_path, here):
    """Where files are read in turns, a pair's speeds become a model row only once both jobs'
    files were read after a minute together: a rate read a turn earlier still mixes lines from
    before they shared (here: the row would say 0.8, a mix of alone and shared, for 0.6)."""
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv), reads_per_node=1)
    snap = ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0, (GpuSample(0, "u", "NVIDIA H200"),),
                                              jobs=()),))
    a, b = _job(1, "resnet50"), _job(2, "mlp", gpu=1)
    last_a = _progress(tmp_path, 1, 0, 99, 10)
    last_b = _progress(tmp_path, 2, 0, 99, 10)
    for now in (100.0, 101.0):   # one file a round: each job's solo rate in turn
        observer.observe([a, b], here.poll(snap, observer, [a, b]), now=now)
    assert observer.solo_rate(1) == 10.0 and observer.solo_rate(2) == 10.0
    b = _job(2, "mlp", gpu=0)   # from now on (job time 100, controller time 1000) they share
    last_a = _progress(tmp_path, 1, 100, 130, 6, first=last_a + 6)
    last_b = _progress(tmp_path, 2, 100, 130, 6, first=last_b + 6)
    rows = []
    for now in (1000.0, 1001.0):
        rows += observer.observe([a, b], here.poll(snap, observer, [a, b]), now=now)[1]
    _progress(tmp_path, 1, 131, 200, 6, first=last_a + 6)
    _progress(tmp_path, 2, 131, 200, 6, first=last_b + 6)
    # a minute together: job 1's turn reads its shared minute; job 2's last read was at 1001
    rows += observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1061.0)[1]
    assert rows == []
    rows += observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1062.0)[1]
    assert rows == [CoLocation("NVIDIA H200", ("resnet50", "mlp"), (0.6, 0.6), 1)]


def test_a_solo_rate_comes_only_from_a_file_read_while_alone(tmp_path, here):
    """A job whose partner left is alone again, but until its file's turn comes its rate is the
    one read while it shared: that must not become its solo rate."""
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv), reads_per_node=1)
    snap = ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0, jobs=()),))
    a, b = _job(1, "resnet50"), _job(2, "mlp", gpu=1)
    last_a = _progress(tmp_path, 1, 0, 99, 10)
    _progress(tmp_path, 2, 0, 99, 10)
    observer.observe([a, b], here.poll(snap, observer, [a, b]), now=100.0)   # reads a: solo
    assert observer.solo_rate(1) == 10.0
    b = _job(2, "mlp", gpu=0)
    _progress(tmp_path, 1, 100, 200, 6, first=last_a + 6)
    observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1000.0)   # reads b
    observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1010.0)   # reads a: shared
    c = _job(3, "mlp", gpu=1)   # b ended; a new job c takes this round's read
    speeds, _ = observer.observe([a, c], here.poll(snap, observer, [a, c]), now=1020.0)
    assert speeds[1] == 1.0 and observer.solo_rate(1) == 10.0


def test_a_read_that_brought_no_new_lines_is_no_fresh_read(tmp_path, here):
    """Two jobs that share but whose files got no new line since (progress stalled, or their
    owner's section of the poll failed): the node answered, but their rates are still the
    ones from before they shared, so no co-location row may come of them (it would say 1.0)."""
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv))
    snap = ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0, (GpuSample(0, "u", "NVIDIA H200"),),
                                              jobs=()),))
    a, b = _job(1, "resnet50"), _job(2, "mlp", gpu=1)
    _progress(tmp_path, 1, 0, 99, 10)
    _progress(tmp_path, 2, 0, 99, 10)
    observer.observe([a, b], here.poll(snap, observer, [a, b]), now=100.0)
    b = _job(2, "mlp", gpu=0)   # they share from 1000 on; neither writes a line since
    rows = observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1000.0)[1]
    rows += observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1061.0)[1]
    assert rows == []


def test_a_job_that_made_no_progress_while_sharing_is_no_model_row(tmp_path, here):
    """A job that reports the same iteration count for the whole window while sharing (a
    validation pass, a checkpoint) shows speed 0, which no fit accepts (a model speed is in
    (0, 2]): recorded, that one row made every later fit with the lab's data fail. It is no
    model row; the pair is recorded once the job moves again."""
    from iadeep_cli.model.data import shipped_pairs, shipped_profiles
    from iadeep_cli.model.fit import fit_parameters

    observer, snap, a, b, last_a, last_b = _resnet50_and_mlp_alone(tmp_path)
    observer.observe([a, b], here.poll(snap, observer, [a, b]), now=100.0)
    b = _job(2, "mlp", gpu=0)   # now they share GPU 0; job 1 stalls at one iteration count
    _progress(tmp_path, 1, 100, 200, 0, first=last_a + 10)
    last_b = _progress(tmp_path, 2, 100, 200, 17, first=last_b + 17)
    observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1000.0)
    _progress(tmp_path, 1, 201, 261, 0, first=last_a + 10)
    last_b = _progress(tmp_path, 2, 201, 261, 17, first=last_b + 17)
    speeds, rows = observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1061.0)
    assert speeds[1] == 0.0 and rows == []
    fit_parameters(shipped_profiles(), shipped_pairs(), extra_observations=rows)
    # moving again (its window past the stall), the pair becomes a row
    _progress(tmp_path, 1, 262, 400, 6, first=last_a + 16)
    _progress(tmp_path, 2, 262, 400, 17, first=last_b + 17)
    speeds, rows = observer.observe([a, b], here.poll(snap, observer, [a, b]), now=1200.0)
    assert rows == [CoLocation("NVIDIA H200", ("resnet50", "mlp"), (0.6, 0.85), 1)]


def test_a_progress_file_with_a_4001_digit_count_fails_no_round_and_no_other_job(tmp_path,
                                                                                  here):
    """Issue 41's attack: two well-formed lines whose counts differ by a 4,001-digit number.
    The round's measurement goes on: the attacker's job has no rate, the other job its own."""
    inv = parse_inventory(f"nodes:\n  - name: here\n    local: true\n    workdir: {tmp_path}\n",
                          tmp_path / "n.yaml")
    observer = SpeedObserver(NodePool(inv))
    snap = ClusterSnapshot(0.0, (NodeSnapshot("here", 0.0, jobs=()),))
    attacker, other = _job(1, "x"), _job(2, "mlp", gpu=1)
    d = tmp_path / "jobs" / "1"
    d.mkdir(parents=True)
    (d / "progress").write_text("100.0 1\n101.0 1" + "0" * 4000 + "\n")
    _progress(tmp_path, 2, 0, 60, 20)
    speeds, rows = observer.observe([attacker, other],
                                    here.poll(snap, observer, [attacker, other]), now=100.0)
    assert speeds == {2: 1.0} and rows == [] and observer.alone_rates == {2: 20.0}

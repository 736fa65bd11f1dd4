"""The controller's own machine (``Node.local``): NVML polling, local jobs, a real controller.

No GPU here, so NVML is the replaying fake in tests/fakes/pynvml (real H200 numbers, real local
processes); everything else is real: the launcher's shell code run by ``LocalConnection``, /proc,
a controller process and the CLI.  Expected values are read from the fixture files here, never
from the code under test.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from helpers.controllers import ControllerProcess, cli, jobs_by_id, queue_add, wait_until
from helpers.local_node import FAKE_PYNVML, local_lab
from iadeep_cli.errors import NodeError
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.nodes.local import on_node
from iadeep_cli.nodes.nvml import poll_local
from iadeep_cli.nodes.poller import NodePool
from iadeep_cli.nodes.shell import backend as L
from iadeep_cli.settings import Inventory, Node

ROOT = Path(__file__).resolve().parents[2]
FAKES = FAKE_PYNVML
SMI = ROOT / "tests" / "fixtures" / "nvidia-smi"
UUID0 = "GPU-bd43dabd-be64-a562-a627-684496845cbc"


def fixture_gpu(base: str) -> dict[str, str]:
    """The real nvidia-smi --query-gpu row for the idle or loaded H200, by field name."""
    fields = ("index", "uuid", "name", "bus", "driver", "mem_total", "mem_used", "mem_free",
              "util_gpu", "util_mem", "temp", "power", "limit")
    text = (SMI / f"h200-{base}-query-gpu-full.csv-noheader-nounits.txt").read_text()
    return dict(zip(fields, [v.strip() for v in text.split(",")]))


def fixture_apps(base: str) -> list[tuple[int, float]]:
    text = (SMI / f"h200-{base}-compute-apps-full.csv-noheader-nounits.txt").read_text()
    return [(int(r.split(",")[0]), float(r.split(",")[3])) for r in text.splitlines() if r]


@pytest.fixture
def fake_nvml(monkeypatch, tmp_path):
    """Import the fake pynvml (fresh per test); set its mode/GPU count with the returned fn."""
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setenv("FAKE_NVML_JOBS_UNDER", str(tmp_path))

    def use(mode="idle", gpus=1):
        monkeypatch.setenv("FAKE_NVML_MODE", mode)
        monkeypatch.setenv("FAKE_NVML_GPUS", str(gpus))
        import pynvml
        assert pynvml.__file__.startswith(str(FAKES))
        return pynvml

    return use


def assert_matches_fixture(gpu, row: dict[str, str]) -> None:
    assert (gpu.index, gpu.uuid, gpu.name) == (0, row["uuid"], row["name"])
    assert gpu.memory_total_mib == float(row["mem_total"])
    assert gpu.memory_used_mib == float(row["mem_used"])
    assert gpu.memory_free_mib == float(row["mem_free"])
    assert gpu.utilization_gpu == float(row["util_gpu"])
    assert gpu.utilization_memory == float(row["util_mem"])
    assert gpu.temperature_c == float(row["temp"])
    assert gpu.power_draw_w == pytest.approx(float(row["power"]))
    assert gpu.power_limit_w == pytest.approx(float(row["limit"]))


# --------------------------------------------------------------------------- poll_local
@pytest.mark.parametrize("base", ["idle", "loaded"])
def test_every_field_is_the_real_h200s(fake_nvml, tmp_path, base):
    nv = fake_nvml(base)
    snap = poll_local("here", str(tmp_path))
    row = fixture_gpu(base)
    assert snap.ok and snap.error is None and snap.driver_version == row["driver"]
    assert len(snap.gpus) == 1
    assert_matches_fixture(snap.gpus[0], row)
    procs = snap.gpus[0].processes
    assert [(p.pid, p.used_memory_mib) for p in procs] == sorted(fixture_apps(base))
    assert all(p.job_id is None for p in procs)
    captured = {s["pid"]: float(s["sm"]) for s in
                json.loads((SMI / "h200-pair-nvml-process-utilization.json").read_text())}
    # per-process SM utilisation: the real capture's figures; a process NVML kept no sample
    # for (6 of the 14 there; all when idle) has none
    assert {p.pid: p.sm_util for p in procs} == {pid: captured.get(pid) for pid, _ in
                                                  fixture_apps(base)}
    mem = {s["pid"]: float(s["mem"]) for s in
           json.loads((SMI / "h200-pair-nvml-process-utilization.json").read_text())}
    assert {p.pid: p.mem_util for p in procs} == {pid: mem.get(pid) for pid, _ in
                                                   fixture_apps(base)}
    with pytest.raises(nv.NVMLError_Uninitialized):   # init and shutdown were balanced
        nv.nvmlDeviceGetCount()


def test_unsupported_counters_become_none_and_the_node_stays_ok(fake_nvml, tmp_path):
    fake_nvml("na")
    snap = poll_local("here", str(tmp_path))
    row = fixture_gpu("loaded")
    assert snap.ok and snap.error is None
    (gpu,) = snap.gpus
    assert (gpu.utilization_gpu, gpu.utilization_memory, gpu.temperature_c, gpu.power_draw_w,
            gpu.power_limit_w) == (None, None, None, None, None)
    assert (gpu.name, gpu.memory_total_mib, gpu.memory_used_mib) == (
        row["name"], float(row["mem_total"]), float(row["mem_used"]))
    assert [p.pid for p in gpu.processes] == sorted(pid for pid, _ in fixture_apps("loaded"))
    assert all(p.used_memory_mib is None for p in gpu.processes)
    assert all(p.sm_util is None for p in gpu.processes)   # not supported: no figure


def test_garbage_from_the_driver_is_not_available(fake_nvml, tmp_path):
    """NVML's unsigned fields read 0xFFFFFFFF on a confused driver: 4294967295 % busy, a
    4.3 MW draw.  Like a remote node's values, they are bounded: "not available"."""
    fake_nvml("garbage")
    (gpu,) = poll_local("here", str(tmp_path)).gpus
    assert (gpu.utilization_gpu, gpu.utilization_memory, gpu.temperature_c, gpu.power_draw_w,
            gpu.power_limit_w) == (None, None, None, None, None)
    assert gpu.memory_total_mib == float(fixture_gpu("loaded")["mem_total"])
    assert gpu.name == fixture_gpu("loaded")["name"] + "?[2J"
    assert gpu.processes and all(p.sm_util is None for p in gpu.processes)


def test_no_driver_is_a_per_node_error(fake_nvml, tmp_path):
    fake_nvml("noinit")
    snap = poll_local("here", str(tmp_path))
    assert not snap.ok and snap.gpus == ()
    assert "NVML" in snap.error and "Driver Not Loaded" in snap.error


def test_only_the_inventorys_gpus(fake_nvml, tmp_path):
    fake_nvml("idle", gpus=4)
    snap = poll_local("here", str(tmp_path), only=(1, 3))
    assert [g.index for g in snap.gpus] == [1, 3]
    uuids = {g.uuid for g in snap.gpus}
    assert len(uuids) == 2 and UUID0 not in uuids
    assert all(g.name == fixture_gpu("idle")["name"] for g in snap.gpus)


def test_real_pynvml_without_a_driver_is_a_per_node_error(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "fakes" not in p])
    import pynvml
    assert "fakes" not in pynvml.__file__
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    snap = poll_local("here", str(tmp_path))
    assert not snap.ok and snap.gpus == () and "NVML" in snap.error


def test_without_pynvml_installed_the_error_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml -> ImportError
    snap = poll_local("here", str(tmp_path))
    assert not snap.ok and "nvidia-ml-py" in snap.error


# --------------------------------------------------------------------------- LocalConnection
TRICKY = ("it's", "$(touch {pwned})", "a;b", "two words", "line\nbreak", '"q"', "", "*")
ECHO = """#!/bin/sh
for a in "$@"; do printf 'ARG<%s>\\n' "$a"; done
printf 'GPUS<%s> JOB<%s>\\n' "$CUDA_VISIBLE_DEVICES" "$IADEEP_JOB_ID"
exit "${CODE:-0}"
"""




def local_node_pool(workdir: str):
    """A pool with one local node (the controller's own machine) keeping jobs in ``workdir``."""
    node = Node(name="here", host="localhost", local=True, workdir=workdir)
    return NodePool(Inventory(nodes=(node,)), command_timeout=10)


@pytest.fixture
def local_pool(tmp_path):
    with local_node_pool(str(tmp_path / "wd")) as pool:
        yield pool
        stop_all(pool)


def stop_all(pool) -> None:
    """Cancel every job the pool's node still runs, so a failing test leaves no process."""
    for pidfile in (Path(on_node(pool.node("here").workdir)) / "jobs").glob("*/pid"):
        L.cancel(pool, "here", int(pidfile.parent.name), grace_s=1)


def job(tmp_path, job_id, body, **spec):
    script = tmp_path / f"job{job_id}.sh"
    script.write_text(body)
    return Job(job_id, "alice", JobSpec(str(script), **spec), JobState.STARTING, 0.0), script


def test_local_jobs_get_exact_arguments_and_exit_codes(local_pool, tmp_path):
    pwned = tmp_path / "pwned"
    args = tuple(a.format(pwned=pwned) for a in TRICKY)
    ok, script = job(tmp_path, 11, ECHO, args=args)
    L.launch(local_pool, "here", ok, [1], script)
    failing, script2 = job(tmp_path, 12, ECHO, env=(("CODE", "7"),))
    L.launch(local_pool, "here", failing, [0], script2)
    wait_until(lambda: all(r.state == "exited"
                           for r in L.reconcile(local_pool, "here", [11, 12]).values()))
    got = L.reconcile(local_pool, "here", [11, 12, 13])
    assert (got[11].exit_code, got[12].exit_code, got[13]) == (0, 7, L.RemoteJob("missing"))
    whole = L.read_log(local_pool, "here", 11)
    log = whole.data
    assert log.decode() == "".join(f"ARG<{a}>\n" for a in args) + "GPUS<1> JOB<11>\n"
    assert whole.offset == whole.size == len(log) and not pwned.exists()
    assert L.read_log(local_pool, "here", 11, 4, 6) == L.LogBytes(log[4:10], 10, len(log))
    assert (tmp_path / "wd" / "jobs" / "11").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("make", [os.mkfifo, lambda p: os.symlink("/dev/zero", p)])
def test_a_local_log_that_is_not_a_regular_file_is_refused(local_pool, tmp_path, make):
    """Read locally without following links or blocking: a FIFO or /dev/zero is refused."""
    d = tmp_path / "wd" / "jobs" / "14"
    d.mkdir(parents=True)
    make(str(d / "log"))
    with pytest.raises(NodeError, match="not a regular file"):
        L.read_log(local_pool, "here", 14, 0, 2 ** 31)


def test_a_running_local_job_is_on_its_gpu_then_cancelled(local_pool, fake_nvml, tmp_path):
    fake_nvml("loaded", gpus=2)
    running, script = job(tmp_path, 21, "#!/bin/sh\necho up\nsleep 30\n")
    res = L.launch(local_pool, "here", running, [1], script)
    assert L.launch(local_pool, "here", running, [1], script).already_started
    wait_until(lambda: L.read_log(local_pool, "here", 21).data == b"up\n")
    snap = local_pool.poll("here")
    assert snap.ok
    gpu0, gpu1 = snap.gpus
    assert all(p.job_id is None for p in gpu0.processes)      # the fixture's foreign load
    mine = [p for p in gpu1.processes if p.job_id == 21]
    assert mine and {p.pid for p in gpu1.processes} == {p.pid for p in mine}
    assert all(p.used_memory_mib == fixture_apps("loaded")[0][1] for p in mine)
    assert {Path(p.name).name for p in mine} <= {"sh", "dash", "bash", "sleep"}
    assert L.reconcile(local_pool, "here", [21])[21] == L.RemoteJob(
        "running", None, res.pid, res.start)
    assert L.cancel(local_pool, "here", 21, grace_s=20) == "terminated"
    assert L.reconcile(local_pool, "here", [21])[21] == L.RemoteJob("exited", 143, res.pid)
    wait_until(lambda: local_pool.poll("here").gpus[1].processes == ())


def test_a_relative_workdir_is_under_home_as_over_ssh(fake_nvml, monkeypatch, tmp_path):
    """An SSH session starts in the home directory; the local node must too, whatever the
    controller's own working directory is."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(elsewhere)
    fake_nvml("idle")
    with local_node_pool("rel-wd") as pool:
        try:
            running, script = job(tmp_path, 31, "#!/bin/sh\necho up\nsleep 30\n")
            L.launch(pool, "here", running, [0], script)
            wait_until(lambda: L.read_log(pool, "here", 31).data == b"up\n")
            assert (home / "rel-wd" / "jobs" / "31" / "pid").is_file()
            assert not (elsewhere / "rel-wd").exists()
            assert any(p.job_id == 31 for p in pool.poll("here").gpus[0].processes)
        finally:
            stop_all(pool)


def test_memory_falls_back_to_nvml_v1_on_older_bindings(fake_nvml, monkeypatch, tmp_path):
    """Without the v2 struct, NVML's v1 counts reserved memory as used (total = free + used)."""
    nv = fake_nvml("idle")
    monkeypatch.delattr(nv, "nvmlMemory_v2")
    (gpu,) = poll_local("here", str(tmp_path)).gpus
    row = fixture_gpu("idle")
    assert gpu.memory_free_mib == float(row["mem_free"])
    assert gpu.memory_used_mib == float(row["mem_total"]) - float(row["mem_free"])


def _start_job_process(tmp_path, job_id: int, gpu: int):
    """A real process carrying job ``job_id``'s environment, as the launcher would start it."""
    import subprocess
    env = {**os.environ, "IADEEP_JOB_ID": str(job_id), "CUDA_VISIBLE_DEVICES": str(gpu),
           "IADEEP_PROGRESS_FILE": str(tmp_path / "jobs" / str(job_id) / "progress")}
    return subprocess.Popen(["sleep", "30"], env=env)


def test_a_process_starting_mid_poll_is_never_shown_as_foreign(fake_nvml, monkeypatch, tmp_path):
    """Regression (CI flake): the GPU's processes were listed twice per poll, once to map pids to
    jobs and once for the sample, so a job process that started in between was 'foreign'.  Here
    the job's process starts right after the first listing of GPU 0, every time."""
    nv = fake_nvml("idle")
    (tmp_path / "jobs" / "41").mkdir(parents=True)
    (tmp_path / "jobs" / "41" / "launched").touch()
    real_list = nv.nvmlDeviceGetComputeRunningProcesses
    started = []

    def list_then_start(handle):
        procs = real_list(handle)
        if not started:
            started.append(_start_job_process(tmp_path, 41, 0))
            wait_until(lambda: any(p.pid == started[0].pid for p in real_list(handle)))
        return procs

    monkeypatch.setattr(nv, "nvmlDeviceGetComputeRunningProcesses", list_then_start)
    try:
        first = poll_local("here", str(tmp_path)).gpus[0].processes
        assert all(p.job_id == 41 for p in first)          # not listed yet, or listed as 41
        second = poll_local("here", str(tmp_path)).gpus[0].processes
        assert [p.job_id for p in second] == [41]
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_a_job_process_before_its_pid_file_is_the_jobs(fake_nvml, tmp_path):
    """Between the launch's claim (``launched``) and its pid file the job already runs: its
    process carries IADEEP_JOB_ID of a claimed directory, so it is the job's, not foreign."""
    fake_nvml("idle")
    (tmp_path / "jobs" / "42").mkdir(parents=True)
    (tmp_path / "jobs" / "42" / "launched").touch()
    proc = _start_job_process(tmp_path, 42, 0)
    try:
        wait_until(lambda: poll_local("here", str(tmp_path)).gpus[0].processes != ())
        (gpu,) = poll_local("here", str(tmp_path)).gpus
        assert [(p.pid, p.job_id) for p in gpu.processes] == [(proc.pid, 42)]
    finally:
        proc.kill()
        proc.wait()
    # an unclaimed directory proves nothing: a process merely claiming a job id stays foreign
    (tmp_path / "jobs" / "42" / "launched").unlink()
    proc = _start_job_process(tmp_path, 42, 0)
    try:
        wait_until(lambda: poll_local("here", str(tmp_path)).gpus[0].processes != ())
        assert [p.job_id for p in poll_local("here", str(tmp_path)).gpus[0].processes] == [None]
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- end to end
FINISHED = {"succeeded", "failed", "cancelled"}


_jobs = jobs_by_id


def test_controller_runs_jobs_on_its_own_machine(monkeypatch, tmp_path):
    inventory = local_lab(monkeypatch, tmp_path / "nodes.yaml", tmp_path / "wd")
    ctl = ControllerProcess(tmp_path / "state", inventory).start()
    try:
        home = ctl.home
        # gated: runs (reporting no progress) until the test has seen it on its GPU; a job
        # that just sleeps a few seconds can end unseen on a loaded machine
        gate = tmp_path / "gate"
        gated_sh = tmp_path / "gated.sh"
        gated_sh.write_text(f"#!/bin/sh\nwhile [ ! -e {gate} ]; do sleep 0.1; done\n")
        hello = queue_add(home, str(ROOT / "jobs/hello.sh"), "a b", "$(x);y", "--env", "SLEEP_S=0")
        steps = queue_add(home, str(ROOT / "jobs/steps_progress.sh"), "15", "0.2",
                          "--workload", "mlp")
        gated = queue_add(home, str(gated_sh))
        seen: dict[int, int] = {}       # job id -> GPU its process was seen on
        name = fixture_gpu("idle")["name"]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            status = json.loads(cli(home, "status", "--json", check=True).stdout)
            if not status["nodes"]:     # the first round has not ended yet
                time.sleep(0.2)
                continue
            (node,) = status["nodes"]
            assert node["name"] == "here", node
            if node["error"] is not None:
                # a round that ended before this poll answered (a loaded machine: the fake
                # NVML reads all of /proc); its answer is used by a later round
                assert "its poll is still running" in node["error"], node
                time.sleep(0.2)
                continue
            assert [g["name"] for g in node["gpus"]] == [name, name]
            jobs = _jobs(home)
            for g in node["gpus"]:
                for p in g["processes"]:
                    assert p["job_id"] in (hello, steps, gated), p
                    assert g["index"] in jobs[p["job_id"]]["gpu_indices"], (p, jobs)
                    seen[p["job_id"]] = g["index"]
            if gated in seen and jobs[gated]["observed_speed"] is not None:
                gate.touch()
            if all(j["state"] in FINISHED for j in jobs.values()):
                break
            time.sleep(0.2)
        assert {i: (jobs[i]["state"], jobs[i]["exit_code"]) for i in (hello, steps, gated)} == {
            hello: ("succeeded", 0), steps: ("succeeded", 0), gated: ("succeeded", 0)}
        assert gated in seen
        # the gated job reports no progress: its speed comes from NVML's per-process SM figure
        assert jobs[gated]["observed_speed"] == 1.0
        assert all(jobs[i]["node"] == "here" for i in (hello, steps, gated))
        log = cli(home, "logs", str(hello), check=True).stdout
        assert "arg 1: a b\narg 2: $(x);y\n" in log
    finally:
        ctl.stop()

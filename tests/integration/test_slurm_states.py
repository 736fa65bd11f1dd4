"""The Slurm backend's job states and node telemetry against a real Slurm 22.05 (started by the
tests, see helpers/slurm.py): a job Slurm keeps pending is `starting` with Slurm's reason, not
`running`, and `queue hold`/`release` of it are Slurm's hold and release; run-time
adaptation's suspend/resume is Slurm's own (scontrol); `--signal` reaches a Slurm job; the
monitor shows and cancels one; a Slurm node also listed under `nodes:` gets its GPUs'
telemetry from nvidia-smi over a real sshd (the stand-in replays real H200 output).

What Slurm did is read back from Slurm itself (squeue, the job's processes in /proc).
"""
from __future__ import annotations

import asyncio
import contextlib
import pwd
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.controllers import cli, rounds_after, wait_until
from helpers.slurm import USER, add, show, slurm_jobs
from iadeep_cli.inventory import parse_inventory
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.nodes import slurm

pytestmark = pytest.mark.os_global
# fixtures (tests/integration/conftest.py): slurm_cluster, a real Slurm for the session;
# lab, a controller of its partition for each test
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def _pool(cluster, nodes_yaml: str = "", inner=None) -> slurm.SlurmPool:
    text = cluster.inventory().replace("nodes: []\n", nodes_yaml or "nodes: []\n")
    inv = slurm.with_slurm_nodes(parse_inventory(text, Path("nodes.yaml")))
    return slurm.SlurmPool(inv, inner, "testinstall", lambda ids: {})


def _job(work: Path, job_id: int, *args: str) -> Job:
    return Job(id=job_id, owner=USER, state=JobState.STARTING,
               spec=JobSpec(script=str(work / "job.sh"), name=f"t{job_id}", args=args,
                            workdir=str(work)),
               submitted_at=time.time(), attempts=1)


@contextlib.contextmanager
def _pending(lab, gate: str) -> Iterator[tuple[int, dict]]:
    """A job (waiting on the file ``gate`` once it runs) that Slurm keeps pending: its
    partition is down in Slurm while the block runs (iadeep still sees the GPUs free), and up
    again after it. Yields the iadeep job id and its `queue show` once Slurm's reason shows."""
    ctl, work, cluster = lab
    cluster.run("scontrol", "update", f"PartitionName={cluster.partition}", "State=DOWN")
    try:
        job_id = add(ctl, work, str(work / "job.sh"), str(work / gate))
        yield job_id, wait_until(lambda: (j := show(ctl, job_id))["remote_pid"] and
                                 "PartitionDown" in j["reason"] and j, limit=120)
    finally:
        cluster.run("scontrol", "update", f"PartitionName={cluster.partition}", "State=UP")


def test_a_job_slurm_keeps_pending_is_starting_with_slurms_reason_until_it_runs(lab):
    """The partition is down in Slurm (iadeep still sees its GPUs free): Slurm accepts the
    sbatch and keeps the job pending. iadeep says `starting`, with Slurm's job id and reason in
    `queue show`/`queue why`, and `running` only once Slurm starts it."""
    ctl, work, cluster = lab
    with _pending(lab, "go-p") as (job_id, job):
        assert slurm_jobs(cluster)[job["remote_pid"]]["job_state"] == "PENDING"
        # several rounds later it is still only starting: pending is not running
        at = time.time()
        for _ in range(6):
            assert show(ctl, job_id)["state"] == "starting"
            at = rounds_after(ctl.home, at)   # a whole round of the controller's since
        why = cli(ctl.home, "queue", "why", str(job_id), check=True).stdout
        assert (f"job {job_id} is starting: submitted to Slurm as job {job['remote_pid']}; "
                "waiting for Slurm (pending: PartitionDown)") in why, why
        assert show(ctl, job_id)["started_at"] is None
    running = wait_until(lambda: (j := show(ctl, job_id))["state"] == "running" and j, limit=120)
    assert slurm_jobs(cluster)[running["remote_pid"]]["job_state"] == "RUNNING"
    assert running["remote_pid"] == job["remote_pid"] and running["attempts"] == 1
    (work / "go-p").touch()
    wait_until(lambda: show(ctl, job_id)["state"] == "succeeded", limit=120)


def test_hold_and_release_of_a_job_slurm_keeps_pending_go_through_scontrol(lab):
    """`queue hold` of a job Slurm keeps pending: iadeep says `held` and Slurm holds it (so it
    does not start when Slurm could start it); `queue release` gives it back to Slurm, which
    starts that same Slurm job where iadeep placed it. A running job cannot be held."""
    from helpers.accounts import cli_as

    ctl, work, cluster = lab
    with _pending(lab, "go-h") as (job_id, job):
        sid = job["remote_pid"]
        out = cli_as(USER, ctl.home, "queue", "hold", str(job_id))
        assert out["rc"] == 0 and f"job {job_id}: held" in out["out"], out
        wait_until(lambda: slurm_jobs(cluster)[sid]["state_reason"].startswith("JobHeld"),
                   limit=120)
    # Slurm could start it now, but it is held there: several rounds later nothing ran
    at = time.time()
    for _ in range(6):
        assert show(ctl, job_id)["state"] == "held"
        assert slurm_jobs(cluster)[sid]["job_state"] == "PENDING"
        at = rounds_after(ctl.home, at)   # a whole round of the controller's since
    out = cli_as(USER, ctl.home, "queue", "release", str(job_id))
    assert out["rc"] == 0 and f"job {job_id}: starting" in out["out"], out
    running = wait_until(lambda: (j := show(ctl, job_id))["state"] == "running" and j, limit=120)
    assert running["remote_pid"] == sid and running["attempts"] == 1
    assert slurm_jobs(cluster)[sid]["job_state"] == "RUNNING"
    assert len([j for j in slurm_jobs(cluster).values()
                if j["name"] == slurm_jobs(cluster)[sid]["name"]]) == 1
    refused = cli_as(USER, ctl.home, "queue", "hold", str(job_id))
    assert refused["rc"] != 0 and "running; it cannot become held" in refused["err"], refused
    (work / "go-h").touch()
    wait_until(lambda: show(ctl, job_id)["state"] == "succeeded", limit=120)


def _proc_states(slurm_id: int) -> set[str]:
    """The /proc states of the Slurm job's processes (those whose environment has its
    SLURM_JOB_ID): R/S running or sleeping, T stopped."""
    tag = f"SLURM_JOB_ID={slurm_id}".encode()
    out = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if tag in (proc / "environ").read_bytes().split(b"\0"):
                out.add((proc / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            pass
    return out


def test_suspend_and_resume_are_slurms_own_and_repeatable(lab):
    """What steps/adaptation.py calls to suspend and resume a job (``Backend.suspend`` and
    ``resume``) is ``scontrol suspend``/``resume`` for a Slurm job: Slurm says SUSPENDED and the
    job's processes are stopped; repeating either (a controller after a crash) changes nothing; the
    poll keeps reporting it as there (iadeep's `suspended` is its own state)."""
    _ctl, work, cluster = lab
    pool = _pool(cluster)
    job = _job(work, 901, str(work / "go-s"))
    sid, _ = slurm.launch(pool, cluster.node, job, (0,), work / "job.sh")
    try:
        wait_until(lambda: slurm_jobs(cluster)[sid]["job_state"] == "RUNNING", limit=120)
        wait_until(lambda: _proc_states(sid), limit=120)
        assert pool.backend(cluster.node).suspend(901, owner=USER)
        assert slurm_jobs(cluster)[sid]["job_state"] == "SUSPENDED"
        wait_until(lambda: _proc_states(sid) == {"T"}, limit=120)
        assert pool.backend(cluster.node).suspend(901, owner=USER)   # again: no-op
        assert slurm_jobs(cluster)[sid]["job_state"] == "SUSPENDED"
        (snap,) = pool.poll_slurm([pool.node(cluster.node)], {cluster.node: ((901, sid, None),)})
        assert snap.job(901) is not None and snap.job(901).state == "running"
        assert pool.backend(cluster.node).resume(901, owner=USER)
        assert slurm_jobs(cluster)[sid]["job_state"] == "RUNNING"
        wait_until(lambda: "T" not in _proc_states(sid), limit=120)
        assert pool.backend(cluster.node).resume(901, owner=USER)  # again: no-op
        assert slurm_jobs(cluster)[sid]["job_state"] == "RUNNING"
    finally:
        slurm.cancel(pool, 901)
    assert not pool.backend(cluster.node).suspend(902, owner=USER)  # no such job


def test_signal_before_the_time_limit_reaches_the_slurm_job(lab):
    """`queue add --time ... --signal USR1@S` on Slurm: iadeep sends it through
    `scancel --signal`; the job's trap gets it and the job ends by itself, as it chose."""
    ctl, work, cluster = lab
    job_id = add(ctl, work, "--time", "2:00", "--signal", "USR1@115", "--wrap",
                 "trap 'echo got-usr1; exit 0' USR1; echo started; "
                 "while :; do sleep 0.1; done")
    done = wait_until(lambda: (j := show(ctl, job_id))["state"] in ("succeeded", "failed",
                                                                   "timeout") and j, limit=180)
    assert done["state"] == "succeeded", done
    log = cli(ctl.home, "logs", str(job_id), check=True).stdout
    assert "started" in log and "got-usr1" in log, log
    assert slurm_jobs(cluster)[done["remote_pid"]]["job_state"] == "COMPLETED"


def test_the_monitor_shows_and_cancels_a_slurm_job(lab, monkeypatch):
    """The real Textual monitor against the controller of a Slurm partition: the Slurm node's
    card and the running job's row, then `c` `y` cancels it in Slurm."""
    from iadeep_cli.tui.app import MonitorApp

    ctl, work, cluster = lab
    job_id = add(ctl, work, "--name", "mon-slurm", str(work / "job.sh"), str(work / "never"))
    job = wait_until(lambda: (j := show(ctl, job_id))["state"] == "running" and j, limit=120)
    monkeypatch.setenv("IADEEP_HOME", str(ctl.home))

    async def drive() -> None:
        app = MonitorApp(auto_refresh=False)
        async with app.run_test(size=(140, 40)) as pilot:
            for _ in range(4):
                await pilot.pause()
                await app.workers.wait_for_complete()
            assert app.view.banner.level == "live"
            assert cluster.node in app._cards
            row = next(r for r in app._rows if r.id == job_id)
            assert row.state == "running"
            index = next(i for i, r in enumerate(app._rows) if r.id == job_id)
            app.query_one("#queue").move_cursor(row=index, animate=False)
            await pilot.press("c", "y")
            for _ in range(4):
                await pilot.pause()
                await app.workers.wait_for_complete()

    asyncio.run(drive())
    wait_until(lambda: show(ctl, job_id)["state"] == "cancelled", limit=120)
    assert slurm_jobs(cluster)[job["remote_pid"]]["job_state"] == "CANCELLED"


def _fixture_gpu0() -> tuple[float, float, list[tuple[int, float]]]:
    """(memory.total, memory.used, [(pid, used memory)] on GPU 0) of the loaded H200 fixture."""
    row = (FIXTURES / "h200-loaded-query-gpu-full.csv-noheader-nounits.txt").read_text()
    fields = [f.strip() for f in row.splitlines()[0].split(",")]
    apps = []
    for line in (FIXTURES / "h200-loaded-compute-apps-full.csv-noheader-nounits.txt"
                 ).read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        if f and f[0].isdigit():
            apps.append((int(f[0]), float(f[3])))
    return float(fields[5]), float(fields[6]), apps


def test_a_slurm_node_listed_under_nodes_gets_nvidia_smi_telemetry(lab, sshd_cluster):
    """The Slurm node also under `nodes:` (same name, a real sshd on 127.0.0.x with the
    stand-in nvidia-smi replaying a loaded H200): its GPUs' memory, utilisation and processes
    come from nvidia-smi, and placement counts the foreign memory; a foreign Slurm job's GPU
    stays full. Without the entry, only Slurm's GRES and `gpu_memory_gib` are known."""
    from iadeep_cli.nodes.poller import NodePool
    from iadeep_cli.scheduler.placement import slots_from_snapshot

    _ctl, work, cluster = lab
    ssh = sshd_cluster(1)
    sshd = ssh.node("node01")
    sshd.set_fake(mode="loaded", gpus=2)
    entry = (f"nodes:\n  - name: {cluster.node}\n    host: {sshd.addr}\n    port: {sshd.port}\n"
             f"    user: {ssh.user}\n    identity_file: {ssh.user_key}\n"
             f"    workdir: {ssh.workdir}\n")
    plain = _pool(cluster)
    pool = _pool(cluster, entry)
    node = pool.node(cluster.node)
    assert node.backend == "slurm" and node.ssh_telemetry and node.gpus == (0, 1)
    pool.inner = NodePool(pool.inventory, known_hosts=[ssh.known_hosts])
    uid = pwd.getpwnam(USER).pw_uid
    foreign = int(cluster.run("sbatch", "--parsable", f"--uid={uid}", f"--gid={uid}",
                              "--export=NONE", "--gres=gpu:g1:1", "-o", "/dev/null",
                              "--wrap", f"while [ ! -e {work}/go-t ]; do sleep 0.1; done")
                  .strip())
    try:
        wait_until(lambda: slurm_jobs(cluster)[foreign]["job_state"] == "RUNNING", limit=120)
        total, used, apps = _fixture_gpu0()
        snap = pool.poll_all().node(cluster.node)
        assert snap is not None and snap.ok, snap
        g0, g1 = snap.gpus
        assert g0.memory_total_mib == total and g0.memory_used_mib == used
        assert g0.utilization_gpu is not None and "H200" in g0.name
        assert {(p.pid, p.used_memory_mib) for p in g0.foreign_processes} >= set(apps)
        assert g1.memory_used_mib == g1.memory_total_mib == total   # Slurm holds it all
        assert f"slurm job {foreign} ({USER})" in {p.name for p in g1.processes}
        # placement sees it: GPU 0's free memory is what nvidia-smi says, its foreign load the
        # H200's processes; from Slurm alone, both GPUs' other one looked empty
        slots = {s.index: s for s in slots_from_snapshot(pool.poll_all(), (), pool.inventory)}
        assert slots[0].memory_free_mib == total - used and slots[0].foreign_mib >= sum(
            m for _, m in apps) > 0
        assert slots[1].memory_free_mib == 0
        bare = {s.index: s for s in slots_from_snapshot(plain.poll_all(), (), plain.inventory)}
        assert bare[0].memory_free_mib == bare[0].memory_total_mib == 80 * 1024
        assert bare[0].foreign_mib == 0
        # nvidia-smi failing on the node: Slurm's figures, not silence (jobs never depend on SSH)
        sshd.set_fake(mode="driverfail")
        snap = pool.poll_all().node(cluster.node)
        assert snap.ok and snap.gpus[0].memory_total_mib == 80 * 1024
    finally:
        (work / "go-t").touch()
        pool.inner.close()

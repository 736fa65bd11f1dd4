"""A program with no profile yet, in the controller (``policy.cold_start``, steps/profile.py):
where the nodes' poll gives per-process figures it starts beside others under a provisional
profile as heavy as the heaviest the lab knows, and is profiled from its own figures while it
shares; where they are missing (MIG, pmon failing, an old driver) it waits for an empty GPU,
and its waiting reason says which. A real store and the real step; the snapshots are written
as the poll parses them."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from iadeep_cli.controller.round.actions import NodeActions
from iadeep_cli.controller.round.context import Context, Round
from iadeep_cli.controller.round.observer import SpeedObserver
from iadeep_cli.controller.round.steps.profile import PROFILE_SAMPLES, Profiler, own_figures
from iadeep_cli.controller.round.steps.schedule import _with_cold_start
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.model.data import shipped_profiles
from iadeep_cli.profiles import PROVISIONAL
from iadeep_cli.scheduler.placement import NO_PROFILE
from iadeep_cli.settings import Inventory, Node, Policy
from iadeep_cli.snapshot import ClusterSnapshot, GpuProcess, GpuSample, NodeSnapshot
from iadeep_cli.store import Store, jobrows

pytestmark = pytest.mark.unit
H200 = 143771.0


def gpu(*procs: GpuProcess, util: float | None = 60.0, index: int = 0) -> GpuSample:
    used = sum(p.used_memory_mib or 0.0 for p in procs)
    return GpuSample(index=index, uuid=f"GPU-{index}", name="NVIDIA H200", memory_total_mib=H200,
                     memory_used_mib=used, memory_free_mib=H200 - used, utilization_gpu=util,
                     utilization_memory=40.0, power_draw_w=500.0, power_limit_w=700.0,
                     processes=procs)


def proc(job_id: int | None, sm: float | None, mem: float | None = 10.0,
         mib: float | None = 8192.0, pid: int = 0) -> GpuProcess:
    return GpuProcess(pid=pid or 100 + (job_id or 0), used_memory_mib=mib, job_id=job_id,
                      sm_util=sm, mem_util=mem)


def snapshot(**nodes: tuple[GpuSample, ...]) -> ClusterSnapshot:
    return ClusterSnapshot(1.0, tuple(NodeSnapshot(n, 1.0, gpus=g, jobs=())
                                      for n, g in nodes.items()))


class Lab:
    def __init__(self, root: Path, cold_start: str = "share", nodes: tuple[str, ...] = ("n1",)):
        inventory = Inventory(nodes=tuple(Node(n, host="localhost", local=True) for n in nodes),
                              policy=Policy(cold_start=cold_start))
        self.store = Store(root / "iadeep.db")
        ctx = Context(self.store, inventory, None, NodeActions(), lambda: 1000.0)  # type: ignore
        self.profiler = Profiler(ctx, SpeedObserver(None))  # type: ignore[arg-type]

    def submit(self, workload: str, running_on: tuple[str, int] | None = None) -> int:
        with self.store.tx() as conn:
            job_id, _ = jobrows.insert(conn, "alice", JobSpec("train.py", workload=workload),
                                       1.0)
            if running_on is not None:
                jobrows.update(conn, job_id, state=JobState.RUNNING.value, node=running_on[0],
                               gpu_indices=(running_on[1],), started_at=1.0)
        return job_id

    def job(self, job_id: int) -> Job:
        with self.store.tx() as conn:
            return jobrows.get(conn, job_id)

    def round(self, snap: ClusterSnapshot) -> Round:
        r = Round(now=1000.0, inventory=self.profiler.inventory, snapshot=snap)
        self.profiler.run(r)
        return r


def sharing_job() -> Job:
    return Job(id=2, owner="alice", spec=JobSpec("t.py", workload="new"), submitted_at=1.0,
               state=JobState.RUNNING, node="n1", gpu_indices=(0,))


def test_a_new_job_sharing_a_gpu_is_sampled_from_its_own_processes_figures():
    job = sharing_job()
    snap = snapshot(n1=(gpu(proc(1, 60.0, 30.0, 20000.0), proc(2, 25.0, 12.0, 6000.0),
                            proc(2, 5.0, None, 1000.0, pid=77)),))
    sample, mem = own_figures(job, snap)
    assert (sample.utilization_gpu, sample.utilization_memory, mem) == (30.0, 12.0, 7000.0)
    assert sample.power_draw_w is None   # the GPU's power is not the job's own


def test_a_shared_gpu_without_per_process_figures_gives_no_sample():
    job = sharing_job()
    mig = snapshot(n1=(gpu(proc(1, None, None), proc(2, None, None)),))
    no_memory = snapshot(n1=(gpu(proc(1, 60.0), proc(2, 25.0, mib=None)),))
    assert own_figures(job, mig) is None and own_figures(job, no_memory) is None


def test_a_new_job_on_a_saturated_gpu_is_not_sampled_from_its_share():
    """The jobs slice a busy GPU's time: its share is less than it would use alone."""
    job = sharing_job()
    figures = (proc(1, 60.0, 30.0, 20000.0), proc(2, 35.0, 12.0, 6000.0))
    assert own_figures(job, snapshot(n1=(gpu(*figures, util=97.0),))) is None
    assert own_figures(job, snapshot(n1=(gpu(*figures, util=None),))) is None
    assert own_figures(job, snapshot(n1=(gpu(*figures, util=89.0),))) is not None


def test_new_programs_share_only_where_every_node_shown_with_jobs_gives_figures(tmp_path):
    lab = Lab(tmp_path, nodes=("n1", "n2"))
    empty = snapshot(n1=(gpu(util=0.0),), n2=(gpu(util=0.0),))
    lab.round(empty)
    assert lab.profiler.share_new(empty) == (False, "no node has shown per-process figures yet")
    lab.round(snapshot(n1=(gpu(proc(1, 60.0)),), n2=(gpu(util=0.0),)))
    assert lab.profiler.share_new(empty) == (True, "")
    mig = snapshot(n1=(gpu(proc(1, 60.0)),), n2=(gpu(proc(3, None, None)),))
    lab.round(mig)
    share, why = lab.profiler.share_new(mig)
    assert not share and why.startswith("node n2's poll gives no per-process figures")
    (tmp_path / "alone").mkdir()
    alone = Lab(tmp_path / "alone", cold_start="alone")
    alone.round(snapshot(n1=(gpu(proc(1, 60.0)),)))
    assert alone.profiler.share_new(empty) == (False, "the lab's policy.cold_start is alone")


def test_a_node_that_gave_figures_loses_them_only_after_polls_in_a_row_without(tmp_path):
    lab = Lab(tmp_path)
    lab.round(snapshot(n1=(gpu(proc(1, 60.0)),)))
    loading = snapshot(n1=(gpu(proc(1, None, None)),))   # pmon: no sample of it this time
    for _ in range(PROFILE_SAMPLES - 1):
        lab.round(loading)
        assert lab.profiler.share_new(loading)[0]
    lab.round(loading)
    assert not lab.profiler.share_new(loading)[0]
    lab.round(snapshot(n1=(gpu(proc(1, 60.0)),)))   # one figure again: it gives them
    assert lab.profiler.share_new(loading)[0]


def test_a_queued_new_program_gets_a_provisional_profile_as_heavy_as_the_heaviest(tmp_path):
    lab = Lab(tmp_path)
    lab.submit("resnet50", running_on=("n1", 0))
    lab.submit("brand-new")
    r = lab.round(snapshot(n1=(gpu(proc(1, 60.0)),)))
    known = shipped_profiles()
    prior = r.provisional["brand-new"]
    assert list(r.provisional) == ["brand-new"] and "brand-new" not in r.profiles
    assert prior.workload == "brand-new" + PROVISIONAL
    assert prior.gpu_util == max(p.gpu_util for p in known.values())
    assert prior.peak_mem_gib == max(p.peak_mem_gib for p in known.values())
    assert r.cold_start.startswith("no profile yet: may start beside others under a provisional")


def test_without_figures_a_new_program_keeps_the_old_rule_and_says_why(tmp_path):
    lab = Lab(tmp_path)
    lab.submit("resnet50", running_on=("n1", 0))
    lab.submit("brand-new")
    r = lab.round(snapshot(n1=(gpu(proc(1, None, None)),)))
    assert r.provisional == {}
    assert r.cold_start == (f"{NO_PROFILE} (node n1's poll gives no per-process figures "
                            "(MIG, nvidia-smi pmon failing, or an old driver))")


def test_a_new_job_sharing_its_gpu_is_profiled_from_its_own_figures(tmp_path):
    lab = Lab(tmp_path)
    lab.submit("resnet50", running_on=("n1", 0))
    new = lab.submit("brand-new", running_on=("n1", 0))
    shared = snapshot(n1=(gpu(proc(1, 60.0, 30.0, 20000.0), proc(new, 35.0, 15.0, 9000.0)),))
    for _ in range(PROFILE_SAMPLES - 1):
        assert "brand-new" not in lab.round(shared).profiles
    r = lab.round(shared)
    profile = r.profiles["brand-new"]
    assert (profile.gpu_util, profile.mem_util, profile.peak_mem_gib) == \
        (35.0, 15.0, pytest.approx(9000.0 / 1024))
    assert r.provisional == {}   # measured now: no provisional profile any more


def test_under_cold_start_alone_a_sharing_new_job_is_not_profiled(tmp_path):
    lab = Lab(tmp_path, cold_start="alone")
    lab.submit("resnet50", running_on=("n1", 0))
    new = lab.submit("brand-new", running_on=("n1", 0))
    shared = snapshot(n1=(gpu(proc(1, 60.0), proc(new, 35.0)),))
    for _ in range(PROFILE_SAMPLES + 1):
        r = lab.round(shared)
    assert "brand-new" not in r.profiles and r.provisional == {}


def test_waiting_reasons_say_what_a_new_program_does():
    queue = [Job(id=i, owner="alice", spec=JobSpec("t.py", workload=w), state=JobState.QUEUED,
                 submitted_at=1.0)
             for i, w in ((1, "new"), (2, "resnet50"), (3, "other-new"))]
    waits = {1: "all 8 GPUs are busy or reserved; waiting for a job to finish",
             2: "exclusive: waits for an empty GPU", 3: NO_PROFILE}
    prior = replace(shipped_profiles()["resnet50"], workload="new" + PROVISIONAL)
    said = _with_cold_start(waits, queue, {"resnet50": prior}, {"new": prior},
                            "no profile yet: may start beside others")
    assert said == {1: "no profile yet: may start beside others; all 8 GPUs are busy or reserved; "
                       "waiting for a job to finish",
                    2: "exclusive: waits for an empty GPU",
                    3: NO_PROFILE}   # (a label with none, which cannot happen: left)
    why = f"{NO_PROFILE} (the lab's policy.cold_start is alone)"
    assert _with_cold_start(waits, queue, {"resnet50": prior}, {}, why)[3] == why

"""Seeded state databases for the monitor's tests, benchmark and the docs' screenshot.

Each scenario writes through the real store API (``jobs.insert``/``transition``,
``cluster.save_nodes``, ``set_meta``) so what the monitor shows went through the same code the
controller uses. Shared-GPU speeds and memory come from the shipped H200 measurements, not from
made-up numbers. Everything is stamped relative to ``now``, so a fixed ``now`` gives a fixed
screen. No Textual here: the benchmark's baseline uses it too.
"""
from __future__ import annotations

import random

from iadeep_cli.jobs import JobSpec, JobState
from iadeep_cli.model.data import shipped_pairs, shipped_profiles
from iadeep_cli.snapshot import GpuProcess, GpuSample, NodeSnapshot
from iadeep_cli.store import Store, cluster, impact, jobrows

NOW = 1_750_000_000.0          # a fixed clock for deterministic screens
H200_MIB = 143771.0
USERS = ("alice", "bob", "chen", "dana", "eve")
WORKLOADS = ("resnet50", "vgg16", "transformer", "lstm", "ncf", "resnet18", "mlp")
WAIT_REASONS = (
    "no GPU with 12 GiB free; sharing would slow job 7 below 0.50",
    "user limit: bob already uses 4 of 4 GPUs",
    "needs 2 whole GPUs on one node; reserving n02:2,3 while they drain",
    "not profiled yet: waits for an empty GPU",
)


def _pair_speeds() -> dict[tuple[str, str], tuple[float, float]]:
    out = {}
    for c in shipped_pairs():
        if len(c.jobs) == 2:
            out[(c.jobs[0], c.jobs[1])] = (c.speeds[0], c.speeds[1])
            out[(c.jobs[1], c.jobs[0])] = (c.speeds[1], c.speeds[0])
    return out


class _Seeder:
    """Writes one scenario inside a single transaction."""

    def __init__(self, conn, now: float):
        self.conn = conn
        self.now = now
        self.profiles = shipped_profiles()
        self.pairs = _pair_speeds()
        self.pid = 4000

    def queued(self, user: str, name: str, workload: str | None, age_s: float, gpus: int = 1,
               priority: int = 0, reason: str = "") -> int:
        spec = JobSpec(script=f"/home/{user}/jobs/{name}.sh", name=name, gpus=gpus,
                       workload=workload, priority=priority)
        job_id, _ = jobrows.insert(self.conn, user, spec, self.now - age_s)
        if reason:
            jobrows.set_reasons(self.conn, [(job_id, reason)])
        return job_id

    def running(self, user: str, name: str, workload: str, node: str, gpus: tuple[int, ...],
                age_s: float, speed: float, observed: float | None) -> int:
        job_id = self.queued(user, name, workload, age_s + 60, gpus=len(gpus))
        started = self.now - age_s
        jobrows.transition(self.conn, job_id, JobState.STARTING, "placed", "controller",
                           started, node=node, gpu_indices=gpus, started_at=started,
                           predicted_speed=speed, attempts=1)
        jobrows.transition(self.conn, job_id, JobState.RUNNING, "started", "controller",
                           started + 2, observed_speed=observed)
        return job_id

    def gpu(self, node: str, index: int, jobs: list[tuple[int, str]],
            foreign: tuple[tuple[str, float], ...] = ()) -> GpuSample:
        """A GPU as nvidia-smi would report it with these jobs (memory/util from profiles)."""
        procs, used, util = [], 0.0, 0.0
        for job_id, workload in jobs:
            prof = self.profiles[workload]
            mem = prof.peak_mem_gib * 1024 + 520
            procs.append(GpuProcess(self._pid(), mem, "python", job_id))
            used, util = used + mem, util + prof.gpu_util
        for name, mem in foreign:
            procs.append(GpuProcess(self._pid(), mem, name, None))
            used, util = used + mem, util + 20
        return GpuSample(index, f"GPU-{node}-{index}", "NVIDIA H200", H200_MIB, used,
                         H200_MIB - used, min(100.0, util), None, 40.0 + util / 4, None, 700.0,
                         tuple(procs))

    def _pid(self) -> int:
        self.pid += 17
        return self.pid

    def shared(self, node: str, index: int, a: tuple[str, str, str], b: tuple[str, str, str]
               ) -> GpuSample:
        """Two jobs (user, name, workload) on one GPU, each at its measured pair speed."""
        sa, sb = self.pairs[(a[2], b[2])]
        ja = self.running(a[0], a[1], a[2], node, (index,), 3600 + 97 * index, sa, sa - 0.02)
        jb = self.running(b[0], b[1], b[2], node, (index,), 1800 + 61 * index, sb, None)
        return self.gpu(node, index, [(ja, a[2]), (jb, b[2])])

    def solo(self, node: str, index: int, user: str, name: str, workload: str) -> GpuSample:
        j = self.running(user, name, workload, node, (index,), 7200 + 13 * index, 1.0, 0.99)
        return self.gpu(node, index, [(j, workload)])

    def nodes(self, *nodes: NodeSnapshot) -> None:
        cluster.save_nodes(self.conn, tuple(nodes))

    def heartbeat(self, age_s: float = 2.0, poll_interval_s: float = 10.0) -> None:
        cluster.set_meta(self.conn, "controller", {
            "pid": 4242, "started_at": self.now - 86400, "heartbeat_at": self.now - age_s,
            "poll_interval_s": poll_interval_s, "nodes": []})


def _busy(s: _Seeder, down: bool = False) -> None:
    n1 = NodeSnapshot("gpu-a", s.now - 3, (
        s.shared("gpu-a", 0, ("alice", "resnet18-sweep", "resnet18"), ("bob", "mlp-base", "mlp")),
        s.shared("gpu-a", 1, ("chen", "vgg16-ft", "vgg16"), ("dana", "lstm-lm", "lstm")),
        s.solo("gpu-a", 2, "alice", "transformer-xl", "transformer"),
        s.gpu("gpu-a", 3, [], foreign=(("jupyter-kernel", 6144.0),)),
    ), driver_version="570.124.06", rtt_s=0.004, jobs=())
    n2 = NodeSnapshot("gpu-b", s.now - 4, (
        s.shared("gpu-b", 0, ("eve", "ncf-rec", "ncf"), ("bob", "mlp-small", "mlp")),
        s.solo("gpu-b", 1, "dana", "resnet50-imagenet", "resnet50"),
        s.gpu("gpu-b", 2, []),
        s.gpu("gpu-b", 3, []),
    ), driver_version="570.124.06", rtt_s=0.006, jobs=())
    s.nodes(n1, n2)
    if down:
        lost = s.running("chen", "bert-pretrain", "transformer", "gpu-c", (0, 1), 5400, 1.0, 0.97)
        jobrows.transition(s.conn, lost, JobState.LOST, "node gpu-c silent for 5m", "controller",
                           s.now - 240)
        last_good = (s.gpu("gpu-c", 0, [(lost, "transformer")]),
                     s.gpu("gpu-c", 1, [(lost, "transformer")]))
        s.nodes(NodeSnapshot("gpu-c", s.now - 300, last_good, driver_version="570.124.06",
                             jobs=()))
        s.nodes(NodeSnapshot("gpu-c", s.now - 10, last_good,
                             error="ssh: timed out after 10s (host 10.0.0.13:22)"))
    for i, (user, name, wl) in enumerate((("bob", "vgg16-aug", "vgg16"),
                                          ("eve", "transformer-big", "transformer"),
                                          ("chen", "ddp-resnet50", "resnet50"),
                                          ("alice", "new-model", None))):
        s.queued(user, name, wl, 900 - 120 * i, gpus=2 if name.startswith("ddp") else 1,
                 reason=WAIT_REASONS[i])
    held = s.queued("dana", "ablation-7", "resnet18", 5000, reason="")
    jobrows.transition(s.conn, held, JobState.HELD, "held by dana", "dana", s.now - 4000)
    s.heartbeat()


def _long_queue(s: _Seeder) -> None:
    _busy(s)
    rng = random.Random(7)
    for i in range(300):
        user = USERS[i % len(USERS)]
        wl = WORKLOADS[rng.randrange(len(WORKLOADS))]
        s.queued(user, f"{wl}-run{i:03d}", wl, rng.uniform(60, 3 * 86400), gpus=rng.choice(
            (1, 1, 1, 2, 4)), priority=rng.choice((0, 0, 0, 1, 5)),
            reason=WAIT_REASONS[i % len(WAIT_REASONS)])


def _large(s: _Seeder, nodes: int = 64, gpus: int = 8, queued: int = 2000) -> None:
    """The benchmark's cluster: every GPU shared by two jobs, a long queue behind them."""
    rng = random.Random(11)
    snaps = []
    for n in range(nodes):
        name = f"node{n:02d}"
        samples = []
        for g in range(gpus):
            a, b = rng.sample(WORKLOADS, 2)
            samples.append(s.shared(name, g, (USERS[g % 5], f"{a}-{n}-{g}", a),
                                    (USERS[(g + 1) % 5], f"{b}-{n}-{g}", b)))
        snaps.append(NodeSnapshot(name, s.now - rng.uniform(0, 8), tuple(samples),
                                  jobs=()))
    s.nodes(*snaps)
    for i in range(queued):
        wl = WORKLOADS[i % len(WORKLOADS)]
        s.queued(USERS[i % 5], f"{wl}-q{i}", wl, rng.uniform(60, 86400),
                 priority=rng.choice((0, 0, 1, 5)), reason=WAIT_REASONS[i % len(WAIT_REASONS)])
    s.heartbeat()


SCENARIOS = {
    "empty": lambda s: None,
    "busy": _busy,
    "down": lambda s: _busy(s, down=True),
    "long_queue": _long_queue,
    "large": _large,
}


def seed(store: Store, scenario: str, now: float = NOW) -> None:
    """Write ``scenario`` (see SCENARIOS) into an empty store, all in one transaction."""
    with store.tx() as conn:
        SCENARIOS[scenario](_Seeder(conn, now))
        # the controller's accounting at its last poll (store/impact.py): the running jobs'
        # work and busy time up to now, as `status` and the monitor's header show them
        nodes = {r["node"] for r in conn.execute("SELECT node FROM node_snapshots")}
        impact.tick(conn, now, {}, impact.last_power(conn, nodes))


def seed_state_dir(scenario: str, now: float = NOW) -> None:
    """Seed the database of the current state directory ($IADEEP_HOME) with ``scenario``."""
    store = Store()
    try:
        seed(store, scenario, now)
    finally:
        store.close()

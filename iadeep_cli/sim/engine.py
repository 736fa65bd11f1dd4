"""Trace-driven, event-driven simulator over the real placement code.

Virtual time: a job's remaining work (solo seconds) shrinks at its current speed (1.0 alone, the
*measured* speed of its group when sharing, see ``truth.py``); the scheduler re-plans on every
arrival and completion. The policies live in ``policies.py`` (a registry): iadeep, exclusive
and the oracle call the same ``plan()`` as the controller; the baselines and the published
peers are written there. A preemptive policy (Tiresias) may stop running jobs: they go back to
the queue with their remaining work. Deterministic for a seed: one ``random.Random`` per
purpose, no clock.

Impact factor: work done in exclusive-GPU-hours (each job's speed relative to running alone
x its GPUs, integrated over time: every finished job contributes duration x GPUs) over busy
GPU-hours (GPUs running at least one job). 1.00 is one job per GPU; the controller's live
figure uses the same definition.
"""
from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import InputError, NotFoundError
from ..jobs import Job, JobSpec, JobState
from ..profiles import Profile
from ..scheduler import fairshare as fs
from ..scheduler.fairshare import UsageLedger
from ..scheduler.placement import GpuSlot, spec_memory_mib
from ..scheduler.priority import RankedQueue
from ..settings import Policy
from .mixed import MEMORY_MIB, MixedTruth
from .policies import Planner, SimPlanner, make_planner, policy_names
from .truth import TruthModel

__all__ = ["DEFAULT_POLICIES", "POLICIES", "Planner", "make_planner"]
POLICIES = policy_names()
# What `iadeep sim` compares with no --policies (the stronger 'search' only when asked: it runs
# many schedules per seed).
DEFAULT_POLICIES = ("exclusive", "packing", "random", "tiresias", "gandiva", "lucid", "iadeep",
                    "oracle")
H200_MIB = 143771.0
DAY_S = 86400.0
# What one preemption costs the preempted job, in seconds of its solo work done again (work
# since its last checkpoint is lost, then saving, restarting and loading take GPU time):
# docs/simulator.md "Preemption cost" gives the published measurements behind it.
PREEMPT_COST_S = 90.0


@dataclass(frozen=True)
class SimJob:
    id: int
    submit_s: float
    workload: str
    duration_s: float      # solo run time
    gpus: int = 1
    user: str = "sim"      # its owner: fair share ranks users by what they ran
    # --phase-shift: after this fraction of its work the job *is* ``phase_to`` (the truth
    # switches; what the scheduler believes does not, unless a policy notices)
    phase_at: float | None = None
    phase_to: str | None = None
    # it declared --requeue: plan() (Policy.preemption) may checkpoint and requeue it; the
    # published peers that preempt (Tiresias) assume every job can, whatever this says
    requeue: bool = False
    name: str = ""         # its job name, where a real trace has one (sim/traces.py)
    # what the scheduler is told it is (sim/coldstart.py: a new program's own label, a
    # coarse or wrong one); "": its workload
    label: str = ""
    # the --time its user asked for, where one is assumed (``sim --forecast``: foresee.py);
    # only the run-time history learns from it (the schedule does not stop jobs at it)
    time_limit_s: float | None = None


@dataclass(frozen=True)
class PolicyResult:
    name: str
    avg_jct_s: float
    p95_jct_s: float
    makespan_s: float
    gpu_busy: float        # time-averaged fraction of GPUs running at least one job
    avg_wait_s: float
    shared_frac: float     # fraction of jobs that shared a GPU at some point
    impact: float = 1.0    # exclusive-GPU-hours of work per busy GPU-hour (1.00: one job/GPU)
    preemptions: int = 0
    # GPU-hours the preemptions cost: each one's checkpoint and restart (preempt_cost_s) x
    # the job's GPUs, work the job did again or spent saving and loading
    preempt_cost_gpu_h: float = 0.0
    jcts: tuple[float, ...] = field(repr=False, default=())
    user_waits: dict[str, float] = field(default_factory=dict)   # mean queue wait per user
    waits: tuple[float, ...] = field(repr=False, default=())   # each started job's queue wait

    def to_dict(self) -> dict:
        out: dict[str, object] = {
            "avg_jct_s": self.avg_jct_s, "p95_jct_s": self.p95_jct_s,
            "makespan_s": self.makespan_s, "gpu_busy": self.gpu_busy,
            "avg_wait_s": self.avg_wait_s, "shared_frac": self.shared_frac,
            "impact": self.impact, "preemptions": self.preemptions,
            "preempt_cost_gpu_h": self.preempt_cost_gpu_h,
            "jobs": len(self.jcts)}
        if len(self.user_waits) > 1:   # a multi-user trace
            out["avg_wait_s_by_user"] = self.user_waits
        return out


# --------------------------------------------------------------------------- workloads
def generate_jobs(workloads: Sequence[str], n: int, gpus: int, load: float, seed: int,
                  multi_gpu_frac: float = 0.1, median_s: float = 5400.0,
                  sigma: float = 1.3) -> list[SimJob]:
    """Poisson arrivals, log-normal solo durations (5 min .. 1 day), uniform workload mix.

    The arrival rate is ``load`` x what the cluster serves running one job per GPU, measured on
    the drawn jobs themselves (sum of GPU-seconds), so load 1.0 saturates 'exclusive' exactly.
    """
    if n < 0:
        raise InputError(f"--jobs must be >= 0, got {n}", hint="e.g. --jobs 300")
    if gpus < 1:
        raise InputError(f"--gpus must be >= 1, got {gpus}", hint="e.g. --gpus 8")
    if not load > 0:
        raise InputError(f"--load must be > 0, got {load}", hint="e.g. --load 1.2")
    if not workloads:
        raise InputError("no workload has both a profile and truth measurements",
                         hint="check --profiles and --truth name the same workloads")
    rng = random.Random(seed)
    names = sorted(workloads)
    big = min(2, gpus)
    drawn = []
    for _ in range(n):
        w = rng.choice(names)
        d = min(DAY_S, max(300.0, rng.lognormvariate(math.log(median_s), sigma)))
        g = big if rng.random() < multi_gpu_frac else 1
        drawn.append((w, d, g))
    gpu_s = sum(d * g for _, d, g in drawn) / max(1, n)
    rate = load * gpus / gpu_s if gpu_s else 1.0
    t, out = 0.0, []
    for i, (w, d, g) in enumerate(drawn):
        out.append(SimJob(i + 1, round(t, 3), w, round(d, 3), g))
        t += rng.expovariate(rate)
    return out


PHASE_WINDOW = (0.2, 0.8)   # a shifting job switches uniformly between 20% and 80% of its work


def add_phase_shifts(jobs: Sequence[SimJob], workloads: Sequence[str], frac: float,
                     seed: int) -> list[SimJob]:
    """``--phase-shift F``: a fraction ``frac`` of the jobs (chosen at random, with a random
    of its own so the trace itself is the same as without) switches to another workload,
    drawn uniformly, at a point drawn uniformly in ``PHASE_WINDOW`` of its work: a warm-up
    ending, an evaluation pass, a curriculum step. From then on the truth treats it as the new
    workload (its speeds with partners are the new workload's)."""
    if not (math.isfinite(frac) and 0.0 <= frac <= 1.0):
        raise InputError(f"--phase-shift must be a fraction between 0 and 1, got {frac:g}",
                         hint="e.g. --phase-shift 0.3 (30% of the jobs change workload)")
    names = sorted(set(workloads))
    if frac == 0.0 or len(names) < 2:
        return list(jobs)
    rng = random.Random(f"phase-shift:{seed}")
    chosen = set(rng.sample([j.id for j in jobs], round(frac * len(jobs))))
    out = []
    for j in jobs:
        if j.id in chosen:
            to = rng.choice([w for w in names if w != j.workload])
            j = replace(j, phase_at=round(rng.uniform(*PHASE_WINDOW), 4), phase_to=to)
        out.append(j)
    return out


def load_trace(path: str | Path, profiles: Mapping[str, Profile]) -> list[SimJob]:
    """CSV ``submit_s,workload,duration_s,gpus,user`` (gpus optional, default 1; user
    optional, default "sim": a trace with several users shows what fair share does)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFoundError(f"{p}: trace file not found",
                            hint="pass a CSV with columns submit_s,workload,duration_s,gpus"
                            ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read trace ({getattr(exc, 'strerror', None) or exc})",
                         hint="check the file's permissions and encoding (UTF-8)") from None
    reader = csv.DictReader(text.splitlines())
    need = {"submit_s", "workload", "duration_s"}
    if reader.fieldnames is None or not need <= set(reader.fieldnames):
        raise InputError(f"{p}: header must have submit_s,workload,duration_s[,gpus][,user]",
                         hint="first line e.g.: submit_s,workload,duration_s,gpus")
    jobs: list[SimJob] = []
    for lineno, row in enumerate(reader, start=2):
        w = (row.get("workload") or "").strip()
        if w not in profiles:
            known = ", ".join(sorted(profiles))
            raise InputError(f"{p}:{lineno}: unknown workload {w!r}",
                             hint=f"known workloads: {known} (or add it to --profiles)")
        submit = _num(p, lineno, row, "submit_s", 0.0)
        dur = _num(p, lineno, row, "duration_s", 1e-9)
        raw = (row.get("gpus") or "").strip()
        g = whole_gpus(p, lineno, "gpus", raw) if raw else 1
        if g < 1:
            raise InputError(f"{p}:{lineno}: gpus: expected at least 1 GPU, got {raw!r}",
                             hint="fix that row of the trace")
        user = (row.get("user") or "").strip() or "sim"
        if any(c.isspace() or not c.isprintable() for c in user):
            raise InputError(f"{p}:{lineno}: user: expected a user name without spaces, "
                             f"got {user!r}", hint="fix that row of the trace")
        jobs.append(SimJob(len(jobs) + 1, submit, w, dur, g, user))
    jobs.sort(key=lambda j: (j.submit_s, j.id))
    return jobs


def whole_gpus(p: Path | str, line: int, col: str, raw: str) -> int:
    """A GPU count: a whole number >= 0; 1.7 is refused, never cut."""
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise InputError(f"{p}:{line}: {col}: expected a whole number of GPUs, got "
                         f"{raw.strip()[:60]!r}", hint="GPUs come whole: fix that row "
                         "(round it yourself if that is what you mean), or leave it out")
    return int(value)


def _num(p: Path, lineno: int, row: dict, col: str, minimum: float,
         default: float | None = None) -> float:
    raw = (row.get(col) or "").strip()
    if not raw and default is not None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{p}:{lineno}: {col}: expected a number, got {raw!r}",
                         hint="fix that row of the trace") from None
    if not math.isfinite(value) or value < minimum:
        raise InputError(f"{p}:{lineno}: {col}: must be >= {minimum:g}, got {raw}",
                         hint="fix that row of the trace")
    return value


def write_trace(jobs: Sequence[SimJob], path: str | Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["submit_s", "workload", "duration_s", "gpus", "user"])
        for j in jobs:
            w.writerow([j.submit_s, j.workload, j.duration_s, j.gpus, j.user])


# --------------------------------------------------------------------------- the event loop
def simulate(jobs: Sequence[SimJob], planner: Planner, truth: TruthModel, *, gpus: int,
             gpus_per_node: int = 8, memory_mib: float = H200_MIB, policy: Policy = Policy(),
             profiles: Mapping[str, Profile], name: str = "",
             progress: Callable[[int, int], None] | None = None,
             layout: Sequence[tuple[str, int]] = (), mixed: MixedTruth | None = None,
             preempt_cost_s: float = PREEMPT_COST_S, learner: Any = None) -> PolicyResult:
    """Run one policy over the trace; returns its metrics. With ``policy.fairshare`` the
    queue is ranked with each user's fair share, from the GPU time the simulation gave them
    (the same ``UsageLedger`` the controller feeds from its database). ``layout`` (with
    ``mixed``, sim/mixed.py): GPU models and counts, each model on its own nodes, each GPU
    reporting its model to the planner; empty: ``gpus`` H200s, as always.
    ``preempt_cost_s``: what each preemption costs the preempted job (added to its remaining
    solo work); a policy that preempts is re-planned whenever a running job's attained
    service crosses one of its ``thresholds`` (GPU-seconds), not only at arrivals and ends.
    ``learner`` (sim/coldstart.Profiler): profiles new programs' labels as the controller
    does, polled like the hooks; a profile learnt re-plans."""
    view = planner.view if isinstance(planner, SimPlanner) else None
    hooks = getattr(planner, "hooks", None)   # a policy that acts at run time (policies.py)
    thresholds = tuple(sorted(getattr(getattr(planner, "fn", planner), "thresholds", ())))
    if view is None:
        thresholds = ()
    # certainly nothing to start on these GPUs; never for a planner that preempts (it may
    # make room on full GPUs)
    full = None if thresholds else getattr(planner, "full", None)
    preemptions = 0
    cost_gpu_s = 0.0
    ran: dict[int, float] = {}   # seconds each job held GPUs (its wait is the rest of its JCT)
    nodes = [(f"n{k}", min(gpus_per_node, gpus - k * gpus_per_node))
             for k in range(math.ceil(gpus / gpus_per_node))]
    node_model: dict[str, str] = {}
    if layout:
        nodes, node_model = _mixed_nodes(layout, gpus_per_node)
    gpu_keys = [(n, i) for n, count in nodes for i in range(count)]
    on_gpu: dict[tuple[str | None, int], list[int]] = {k: [] for k in gpu_keys}
    specs = {j.id: j for j in jobs}
    mem = {j.id: _mem_mib(j, profiles, policy) for j in jobs}
    # the queue, kept ranked by submission as jobs come and go: what the planners get (a
    # queue at load 1.2 grows to thousands; none is sorted again each round)
    queued = RankedQueue()
    running: dict[int, Job] = {}
    remaining: dict[int, float] = {}
    speed: dict[int, float] = {}
    shared: set[int] = set()
    jct: dict[int, float] = {}
    started: dict[int, float] = {}
    arrivals = sorted(jobs, key=lambda j: (j.submit_s, j.id))
    phases = _Phases(jobs)
    nxt, t, busy_gpu_s, done = 0, 0.0, 0.0, 0
    t0 = arrivals[0].submit_s if arrivals else 0.0
    fair = policy.fairshare
    ledger = UsageLedger(fair.half_life_s) if fair is not None else None
    # a mixed cluster's truth per GPU (its model's): the solo factor, and a group's speeds
    factor_on = speeds_on = None
    if mixed is not None and node_model:
        def factor_on(key, name):
            return mixed.factor(name, node_model[key[0]])

        def speeds_on(key, names):
            return mixed.speeds(node_model[key[0]], names)
    for j in jobs:   # larger than a node: a gang of whole nodes; larger than all: never
        if j.gpus > len(gpu_keys):
            raise InputError(f"job {j.id} needs {j.gpus} GPUs; the cluster has "
                             f"{len(gpu_keys)}", hint="lower its gpus or raise --gpus")
    held: dict[int, list[tuple[str, int]]] = {}   # a running job's GPUs, a gang's included
    while nxt < len(arrivals) or queued or running:
        t_arr = arrivals[nxt].submit_s if nxt < len(arrivals) else math.inf
        ends = {i: t + remaining[i] / speed[i] for i in running if i not in phases.paused}
        t_done = min(ends.values(), default=math.inf)
        t_cross = _next_crossing(t, running, view.attained, thresholds) \
            if thresholds and view is not None and queued else math.inf
        t_next = min(t_arr, t_done, phases.next_switch(t, running, remaining, speed),
                     hooks.next_poll(t) if hooks is not None and running else math.inf,
                     t_cross, learner.next_poll(t, running) if learner is not None else math.inf)
        if t_next == math.inf:
            stuck = ", ".join(str(j.id) for j in queued[:5])
            raise InputError(f"jobs {stuck} can never start (too big for any GPU/node)",
                             hint="check their gpus and memory against --gpus")
        dt = t_next - t
        if dt > 0:
            busy_gpu_s += dt * sum(1 for k in gpu_keys if on_gpu[k])
            for i in running:
                remaining[i] -= speed.get(i, 0.0) * dt
                ran[i] = ran.get(i, 0.0) + dt
            if view is not None:
                for i, job in running.items():
                    view.attained[i] = view.attained.get(i, 0.0) + dt * job.spec.gpus
        t = t_next
        finished = [i for i, end in ends.items() if end <= t + 1e-9 * max(1.0, t)]
        for i in finished:
            running.pop(i)
            for key in held.pop(i):
                on_gpu[key].remove(i)
            jct[i] = t - specs[i].submit_s
            done += 1
            if view is not None:   # its run time, as the controller records it, and its owner
                view.durations.add(specs[i].label or specs[i].workload, ran.get(i, 0.0),
                                   specs[i].user, specs[i].time_limit_s)
            if ledger is not None:
                ledger.stop(i, t)
        switched = phases.switch(running, remaining, t)
        acted = hooks.step(t, running, on_gpu, phases, speed, factor_on) \
            if hooks is not None and running else False
        if learner is not None and running:
            acted = learner.step(t, running, on_gpu, phases.now, phases.paused) or acted
        crossed = t_next == t_cross
        arrived = nxt < len(arrivals) and arrivals[nxt].submit_s <= t
        while nxt < len(arrivals) and arrivals[nxt].submit_s <= t:
            sj = arrivals[nxt]
            queued.add(Job(sj.id, sj.user,
                           JobSpec("sim", workload=sj.label or sj.workload, gpus=sj.gpus,
                                   requeue=sj.requeue),
                           JobState.QUEUED, sj.submit_s))
            nxt += 1
        rounds, again, moved = 0, False, False
        # a switch or a quiet poll: no news; a plan that preempted is followed at once by one
        # that places the jobs it made room for (the controller's next round); every GPU
        # holding all the policy allows: the round would start nothing (``full``), skipped
        while queued and (arrived or finished or acted or crossed or again) and rounds < 3:
            rounds += 1
            slots = _slots(gpu_keys, node_model, memory_mib, on_gpu, mem, policy)
            if full is not None and full(slots):
                break
            points = None
            if ledger is not None and fair is not None:
                users = {j.owner for j in queued} | {j.owner for j in running.values()}
                points = fs.points(fs.shares(ledger.usage(t), users, fair))
            result = planner(queued, slots, list(running.values()), t, points)
            moved = moved or bool(result.preempt or result.placements)
            for i in result.preempt:
                job = running.pop(i)
                if ledger is not None:
                    ledger.stop(i, t)
                for key in held.pop(i):
                    on_gpu[key].remove(i)
                queued.add(replace(job, state=JobState.QUEUED, node=None, gpu_indices=()))
                preemptions += 1
                remaining[i] += preempt_cost_s
                cost_gpu_s += preempt_cost_s * job.spec.gpus
            for p in result.placements:
                job = queued.pop(p.job_id)
                if hooks is not None:
                    hooks.placed(p.predicted_speeds)
                    hooks.start(p.job_id, job.spec.workload or "")
                if ledger is not None:
                    ledger.start(p.job_id, job.owner, len(p.gpu_keys()), t)
                running[p.job_id] = replace(job, state=JobState.RUNNING, node=p.node,
                                            gpu_indices=p.gpu_indices, started_at=t)
                remaining.setdefault(p.job_id, specs[p.job_id].duration_s)  # kept if preempted
                started.setdefault(p.job_id, t)
                keys = held[p.job_id] = p.gpu_keys()
                for key in keys:
                    on_gpu[key].append(p.job_id)
            if not result.preempt:
                break
            again = True   # at once: the GPUs they left
        if arrived or finished or acted or switched or crossed or again or hooks is None:
            _update_speeds(running, on_gpu, truth, speed, shared, phases, speeds_on)
            if hooks is not None and (finished or switched or acted or moved):
                hooks.changed()   # its next poll looks again (a quiet one only draws)
        if progress is not None and finished:
            progress(done, len(jobs))
    res = _metrics(name, jobs, jct, started, busy_gpu_s, len(gpu_keys), t - t0, shared, ran)
    work = sum(j.duration_s * j.gpus for j in jobs if j.id in jct)
    return replace(res, impact=work / busy_gpu_s if busy_gpu_s > 0 else 1.0,
                   preemptions=preemptions, preempt_cost_gpu_h=cost_gpu_s / 3600.0)


def _next_crossing(t: float, running, attained: Mapping[int, float],
                   thresholds: Sequence[float]) -> float:
    """When the next running job's attained service (GPU-seconds) reaches a threshold."""
    out = math.inf
    for i, job in running.items():
        a = attained.get(i, 0.0)
        for thr in thresholds:
            if a < thr - 1e-6:
                out = min(out, t + (thr - a) / max(1, job.spec.gpus))
                break
    return out


def _mixed_nodes(layout: Sequence[tuple[str, int]], per_node: int
                 ) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """Nodes of up to ``per_node`` GPUs, model by model in the order given: n0, n1, ..."""
    nodes: list[tuple[str, int]] = []
    model_of: dict[str, str] = {}
    for model, count in layout:
        for k in range(math.ceil(count / per_node)):
            name = f"n{len(nodes)}"
            nodes.append((name, min(per_node, count - k * per_node)))
            model_of[name] = model
    return nodes, model_of


def _slots(gpu_keys, node_model: Mapping[str, str], memory_mib: float, on_gpu, mem,
           policy: Policy) -> tuple[GpuSlot, ...]:
    """The GPUs as plan() sees them now; on a mixed cluster (``node_model``) each of its
    model's memory size and model key, else ``memory_mib`` and no key."""
    out = []
    for n, i in gpu_keys:
        total = MEMORY_MIB[node_model[n]] if node_model else memory_mib
        out.append(GpuSlot(n, i, total, total - sum(mem[j] for j in on_gpu[(n, i)]),
                           tuple(sorted(on_gpu[(n, i)])), policy.max_jobs_per_gpu,
                           gpu_model=node_model.get(n, "")))
    return tuple(out)


def _mem_mib(j: SimJob, profiles: Mapping[str, Profile], policy: Policy) -> float:
    """What job ``j`` holds on each of its GPUs: the placer's rule
    (``placement.spec_memory_mib``), an unknown need counted as 0 as the placer counts it on
    the GPU a job runs on (``slots_from_snapshot``)."""
    return spec_memory_mib(JobSpec("sim", workload=j.workload), profiles, policy) or 0.0


def _update_speeds(running, on_gpu, truth: TruthModel, speed: dict, shared: set,
                   phases: _Phases, on_model: Callable | None = None) -> None:
    """Every running job's current speed: the truth for its GPU's group (slowest GPU wins),
    for the workload each job *is* now (``phases``); a suspended job has none and is no
    partner. ``on_model(gpu key, workloads)``: a mixed cluster's truth, solo factor included."""
    speed.clear()
    for key, all_ids in on_gpu.items():
        ids = [i for i in all_ids if i not in phases.paused]
        if not ids:
            continue
        names = [phases.now[i] for i in ids]
        if on_model is not None:
            s = on_model(key, names)
        else:
            s = truth.speeds(names) if len(ids) > 1 else (1.0,)
        if len(ids) > 1:
            shared.update(ids)
        for i, v in zip(ids, s):
            speed[i] = min(speed.get(i, math.inf), max(v, 1e-6))


class _Phases:
    """What each job is now (``--phase-shift``) and which jobs a run-time policy suspended:
    the truth's side, kept apart from what the scheduler believes (the jobs' labels)."""

    def __init__(self, jobs: Sequence[SimJob]):
        self.now: dict[int, str] = {j.id: j.workload for j in jobs}
        # job id -> (remaining work at which it switches, to what)
        self.pending: dict[int, tuple[float, str]] = {
            j.id: ((1.0 - j.phase_at) * j.duration_s, j.phase_to)
            for j in jobs if j.phase_to is not None and j.phase_at is not None}
        self.paused: set[int] = set()

    def next_switch(self, t: float, running, remaining, speed) -> float:
        out = math.inf
        if not self.pending:   # no --phase-shift, or every switch done: no pass per event
            return out
        for i in running:
            if i in self.pending and speed.get(i):
                out = min(out, t + max(0.0, remaining[i] - self.pending[i][0]) / speed[i])
        return out

    def switch(self, running, remaining, t: float) -> bool:
        """Switch the jobs that reached their point; whether any did."""
        switched = False
        if not self.pending:
            return switched
        for i in list(running):
            if i in self.pending and remaining[i] <= self.pending[i][0] + 1e-9 * max(1.0, t):
                self.now[i] = self.pending.pop(i)[1]
                switched = True
        return switched


def _metrics(name, jobs, jct, started, busy_gpu_s, n_gpus, makespan, shared,
             ran: Mapping[int, float] | None = None) -> PolicyResult:
    """``ran``: the seconds each job held GPUs; a finished job's queue wait is then every
    period it did not (before its first start and while preempted), else up to its start."""
    values = sorted(jct.values())
    if not values:
        return PolicyResult(name, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    p95 = values[min(len(values) - 1, math.ceil(0.95 * len(values)) - 1)]

    def wait(j: SimJob) -> float:
        if ran is not None and j.id in jct:
            return max(0.0, jct[j.id] - ran.get(j.id, 0.0))
        return started[j.id] - j.submit_s
    waits = [wait(j) for j in jobs if j.id in started]
    by_user: dict[str, list[float]] = {}
    for j in jobs:
        if j.id in started:
            by_user.setdefault(j.user, []).append(wait(j))
    return PolicyResult(
        name, sum(values) / len(values), p95, makespan,
        busy_gpu_s / (n_gpus * makespan) if makespan > 0 else 0.0,
        sum(waits) / len(waits), len(shared) / len(jobs),
        jcts=tuple(jct[j.id] for j in jobs if j.id in jct),
        user_waits={u: sum(w) / len(w) for u, w in sorted(by_user.items())},
        waits=tuple(waits))

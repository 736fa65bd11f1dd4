"""The simulator's placement policies: one registry, each entry a planner factory and its source.

A planner is ``planner(queue, slots, active, now, fairshare=None) -> Plan``, the signature of
``plan()`` (``fairshare``: priority points per user, see ``scheduler.fairshare``): the
iadeep policies *are* ``plan()`` (pure, shared with the controller); the baselines and the
published peers are written here, in the simulator, and never reach the controller. A planner
may return a ``SimPlan`` whose ``preempt`` lists running jobs to stop and requeue (Tiresias is
preemptive; the engine keeps their remaining work, as a checkpoint/restart would).

Each peer is implemented from its paper's description. Where the description leaves a choice,
the choice is written next to the code and in docs/simulator.md:

* ``tiresias`` (Tiresias, NSDI'19): discretised two-dimensional least-attained-service (2D-LAS)
  without sharing: attained service = GPUs x seconds run; two queues split at
  ``TIRESIAS_Q1_GPU_S`` (1 GPU-hour; the paper tunes its thresholds per cluster), FIFO by
  submission inside a queue, preemptive (a queue-1 job waiting while a queue-2 job runs takes
  its GPUs). Choices: restarts are free (no checkpoint cost: optimistic for Tiresias), the
  starvation knob (PromoteKnob) is off, consolidated placement (a multi-GPU job's GPUs on one
  node) always.
* ``gandiva`` (Gandiva, OSDI'18): a job takes an empty GPU when there is one; when the cluster
  is oversubscribed it is packed onto the GPU with the lowest summed utilisation of its jobs
  (profiled GPU utilisation), interference-blind. Choices: Gandiva's introspective unpacking
  and migration are not modelled (the simulator does not migrate), so its packing is final.
* ``lucid`` (Lucid, ASPLOS'23): non-intrusive packing rules. Each workload gets a sharing score
  from its profile: 0 tiny, 1 medium, 2 jumbo (``lucid_score``: utilisation and memory
  thresholds); two jobs may share only when their scores sum to at most 2, memory fits, both
  use one GPU, and the partner is running alone (at most two per GPU). Among compatible running
  partners it takes the one that started first (the affinity picker of Lucid's simulator takes
  the first compatible job in its run list). Sharing is enabled only under pressure (more
  queued jobs than empty GPUs: Lucid's 'prescient adaptive sharing', here with the exact queue
  rather than a forecast). Choices: the thresholds (the paper learns them with a decision tree
  on its own cluster's profiles; ours are round numbers at the same cut points: 25 % and 75 %
  utilisation, 25 % and 50 % of GPU memory); queue order is FIFO, because Lucid orders by a
  duration estimate learned from job attributes and in this simulator a job's duration is
  independent of its workload, so that estimate is the same for every job.
"""
from __future__ import annotations

import heapq
import itertools
import math
import operator
import random
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from ..errors import InputError
from ..jobs import Job
from ..profiles import Profile
from ..scheduler import placement
from ..scheduler.gpumodels import ModelSpeeds
from ..scheduler.inputs import PlanInputs
from ..scheduler.placement import GpuSlot, Placement, Plan, plan
from ..scheduler.prediction import CachedModel, CautiousModel, Predictor
from ..scheduler.priority import RankedQueue, order_queue
from ..scheduler.remaining import Durations
from ..settings import Policy
from .adaptive import AdaptHooks
from .truth import TruthModel

# (queue, slots, active, now, fair-share points per user or None) -> Plan
Planner = Callable[[Sequence[Job], tuple[GpuSlot, ...], list[Job], float,
                    Mapping[str, float] | None], Plan]

TIRESIAS_Q1_GPU_S = 3600.0     # queue-1 limit: 1 GPU-hour of attained service
LUCID_UTIL_CUTS = (25.0, 75.0)     # % GPU utilisation: tiny below the first, jumbo from the second
LUCID_MEM_CUTS = (0.25, 0.50)      # fraction of GPU memory: same roles


# A plan that may also stop running jobs: ``Plan.preempt`` (they go back to the queue, work
# kept less the preemption cost, sim/engine.py); the old name stays for the peers written here.
SimPlan = Plan


@dataclass
class SimView:
    """What the engine tells a planner beyond ``plan()``'s arguments (a real scheduler knows it
    too): each job's attained service in GPU-seconds, updated as virtual time passes."""

    attained: dict[int, float] = field(default_factory=dict)
    # the run times of the jobs finished so far (wall time from start to end, per workload
    # label), as the controller reads them from its database: what ``sharing: jct`` knows
    durations: Durations = field(default_factory=Durations)


class SimPlanner:
    """A planner with the engine state it reads (``view``)."""

    def __init__(self, fn: Planner, view: SimView):
        self.fn = fn
        self.view = view
        # a policy that acts on running jobs (``adaptive.AdaptHooks``): the engine drives it
        self.hooks = getattr(fn, "hooks", None)
        # ``full(slots)``: True when the planner certainly starts and stops nothing on these
        # GPUs (each holds as many jobs as the policy allows): the engine then skips the
        # round (its queue may be thousands long); None: always call it
        self.full: Callable[[Sequence[GpuSlot]], bool] | None = getattr(fn, "full", None)

    def __call__(self, queue, slots, active, now, fairshare=None) -> Plan:
        return self.fn(queue, slots, active, now, fairshare)


@dataclass(frozen=True)
class PolicyContext:
    profiles: Mapping[str, Profile]
    model: Predictor          # the predictor iadeep uses (never the truth)
    truth: TruthModel         # what reference policies may use
    policy: Policy
    mem: Mapping[int, float]  # job id -> MiB per GPU
    seed: int
    view: SimView
    # each workload's solo speed per GPU model, on a mixed cluster (sim/mixed.py); None: one model
    speeds: ModelSpeeds | None = None


@dataclass(frozen=True)
class PolicySpec:
    name: str
    build: Callable[[PolicyContext], Planner]
    source: str
    reference: bool = False   # uses the true speeds: a yardstick, not a competitor
    # a search: run_sim simulates every Policy this returns and keeps the best avg JCT
    variants: Callable[[Policy], list[Policy]] | None = None


REGISTRY: dict[str, PolicySpec] = {}


def register(name: str, source: str, reference: bool = False,
             variants: Callable[[Policy], list[Policy]] | None = None):
    def deco(build: Callable[[PolicyContext], Planner]):
        REGISTRY[name] = PolicySpec(name, build, source, reference, variants)
        return build
    return deco


def policy_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def is_reference(name: str) -> bool:
    spec = REGISTRY.get(name.removesuffix("+fs"))   # "oracle+fs": oracle with fair share
    return bool(spec and spec.reference)


def make_planner(name: str, profiles: Mapping[str, Profile], model: Predictor, truth: TruthModel,
                 policy: Policy, mem: Mapping[int, float], seed: int,
                 speeds: ModelSpeeds | None = None) -> SimPlanner:
    spec = REGISTRY.get(name)
    if spec is None:
        raise InputError(f"unknown policy {name!r}",
                         hint=f"choose from {', '.join(policy_names())}")
    view = SimView()
    ctx = PolicyContext(profiles, model, truth, policy, mem, seed, view, speeds)
    return SimPlanner(spec.build(ctx), view)


# --------------------------------------------------------------------------- plan() itself
def _plan_with(model: Predictor, ctx: PolicyContext, exclusive: bool = False,
               models: bool = True, hooks: AdaptHooks | None = None) -> Planner:
    """plan() as the controller calls it; ``models``: it knows each workload's speed per GPU
    model on a mixed cluster (False: blind to the model, as a scheduler without profiles per
    model, e.g. Slurm's 'exclusive', would be); ``hooks``: the run-time adaptation whose GPUs
    closed to partners each round heeds (``planner.hooks``, which the engine drives)."""
    m = CachedModel(model)
    # exclusive stands for Slurm's default: no learnt run times, no preemption
    pol = replace(ctx.policy, max_jobs_per_gpu=1, preemption="off") if exclusive \
        else ctx.policy
    speeds = ctx.speeds if models and not exclusive else None
    inputs = PlanInputs(ctx.profiles, m, pol, {}, speeds=speeds,
                        durations=None if exclusive else ctx.view.durations,
                        attained=ctx.view.attained, gangs=True, reasons=False)

    def planner(queue, slots, active, now, fairshare=None):
        if exclusive:
            slots = tuple(replace(s, max_jobs=1) for s in slots)
        # fair-share points and the GPUs closed to partners change between calls
        return plan(queue, slots, active, now,
                    inputs if fairshare is None and hooks is None else
                    replace(inputs, fairshare=fairshare,
                            closed=hooks.closed if hooks is not None else None))
    if hooks is not None:
        planner.hooks = hooks    # type: ignore[attr-defined]
    if pol.preemption != "off":   # re-planned as a job crosses a level (sim/engine.py)
        planner.thresholds = placement.LAS_LEVELS_GPU_S   # type: ignore[attr-defined]
    else:   # plan() has room only on an empty GPU or one with fewer jobs than its max_jobs
        planner.full = _full_at(1 if exclusive else None)   # type: ignore[attr-defined]
    return planner


def _full_at(cap: int | None) -> Callable[[Sequence[GpuSlot]], bool]:
    """Whether every GPU holds as many jobs as the policy lets it: ``cap`` its ceiling on a
    GPU's own ``max_jobs`` (None: the GPU's, at least 1, as plan() reads it)."""
    def full(slots: Sequence[GpuSlot]) -> bool:
        if cap is None:
            return all(len(s.job_ids) >= max(1, s.max_jobs) for s in slots)
        return all(len(s.job_ids) >= min(s.max_jobs, cap) for s in slots)
    return full


@register("exclusive", "one job per GPU, priority/FIFO order with backfill (Slurm's default)")
def _exclusive(ctx: PolicyContext) -> Planner:
    return _plan_with(ctx.model, ctx, exclusive=True)


@register("iadeep", "plan() with the fitted predictor, its speeds lowered where it is unsure, "
                    "and the controller's run-time adaptation (adaptive.py)")
def _iadeep(ctx: PolicyContext) -> Planner:
    return _plan_with(CautiousModel(ctx.model), ctx,
                      hooks=AdaptHooks(ctx.profiles, ctx.policy.adapt, ctx.seed))


@register("iadeep-static", "plan() as iadeep, with no run-time action: a placement is final")
def _iadeep_static(ctx: PolicyContext) -> Planner:
    return _plan_with(CautiousModel(ctx.model), ctx)


@register("iadeep-blind-model", "iadeep ignoring the GPU model on a mixed cluster (every "
                                "model taken as equally fast; the same as iadeep on one model)")
def _iadeep_blind_model(ctx: PolicyContext) -> Planner:
    return _plan_with(CautiousModel(ctx.model), ctx, models=False)


@register("oracle", "plan() with the measured speeds instead of predictions", reference=True)
def _oracle(ctx: PolicyContext) -> Planner:
    return _plan_with(ctx.truth, ctx)


SEARCH_THRESHOLDS = (0.8, 0.9, 1.0, 1.1, 1.25)
SEARCH_MAX_JOBS = (2, 3)
SEARCH_FLOORS = (0.3, 0.5)


def search_variants(policy: Policy) -> list[Policy]:
    """The schedules 'search' tries: plan()'s rule with the true speeds under every share
    threshold x jobs per GPU x speed floor here (20 full simulations per trace)."""
    return [replace(policy, sharing="threshold", share_threshold=t, max_jobs_per_gpu=k,
                    min_speed=f)
            for t in SEARCH_THRESHOLDS for k in SEARCH_MAX_JOBS for f in SEARCH_FLOORS]


@register("search", "hindsight best of 20 schedules: plan() with the true speeds under every "
                    "share threshold x jobs per GPU x floor, the best avg JCT per trace",
          reference=True, variants=search_variants)
def _search(ctx: PolicyContext) -> Planner:
    return _plan_with(ctx.truth, ctx)


# --------------------------------------------------------------------------- blind baselines
PEER_MAX_JOBS = 2   # the peers share a GPU in pairs at most, whatever iadeep's cap


def _gpu_state(slots, active: Sequence[Job], ctx: PolicyContext) -> dict:
    """Working copy per GPU: [jobs, free MiB, holds a solo job, cap, summed util, job ids]."""
    solo = {j.id for j in active if j.spec.gpus > 1}
    util = {j.id: _util(ctx.profiles, j) for j in active}
    return {(s.node, s.index): [len(s.job_ids), s.memory_free_mib or 0.0,
                                any(i in solo for i in s.job_ids), min(s.max_jobs, PEER_MAX_JOBS),
                                sum(util.get(i, 0.0) for i in s.job_ids), list(s.job_ids)]
            for s in slots}


def _has_room(state: dict) -> bool:
    """Whether any GPU could still take a job this round (fewer jobs than its cap; a reserved
    GPU's cap is 0): once none can, nothing further in the queue starts."""
    return any(st[0] < st[3] for st in state.values())


def _util(profiles: Mapping[str, Profile], job: Job) -> float:
    prof = profiles.get(job.spec.workload or "")
    return prof.gpu_util if prof else 100.0


Chooser = Callable[[Job, list, dict], "tuple[str, int] | None"]


def _blind(ctx: PolicyContext, choose: Chooser) -> Planner:
    """Interference-blind placement with plan()'s queue discipline: memory and the per-GPU cap
    are the only rules; ``choose(job, fitting_gpu_keys, state)`` picks the GPU (None: wait).
    Multi-GPU jobs get empty GPUs on one node (fewest-empty node first) and nothing joins them;
    a blocked one reserves GPUs after policy.reserve_after_s exactly as in plan()."""
    policy, mem = ctx.policy, ctx.mem

    def planner(queue, slots, active, now, fairshare=None):
        state = _gpu_state(slots, active, ctx)
        out: list[Placement] = []
        waits: dict[int, str] = {}
        reserved = False
        room = _has_room(state)
        # memory needs of one-GPU jobs that found no GPU, and ("whole node", GPUs, memory)
        # of multi-GPU jobs that found no whole node
        failed: set[float | tuple] = set()
        for job in order_queue(queue, policy, now, fairshare):
            if not room:
                break   # no GPU takes another job: the rest of the queue waits ("full")
            need = mem[job.id]
            if job.spec.gpus > 1:
                reserved, changed = _multi_gpu(state, job, need, now, policy, out, waits,
                                               reserved, failed)
                if changed:
                    room = _has_room(state)
                continue
            if need in failed:   # GPUs unchanged since a job as big found none
                waits[job.id] = "full"
                continue
            fit = [k for k, st in state.items() if st[0] < st[3] and st[1] >= need and not st[2]]
            pick = choose(job, fit, state) if fit else None
            if pick is None:
                waits[job.id] = "full"
                failed.add(need)
                continue
            _take(state[pick], job, need, _util(ctx.profiles, job))
            out.append(Placement(job.id, pick[0], (pick[1],)))
            failed.clear()
            room = _has_room(state)
        return Plan(tuple(out), waits)
    planner.full = _full_at(PEER_MAX_JOBS)   # type: ignore[attr-defined]
    return planner


def _multi_gpu(state: dict, job: Job, need: float, now: float, policy: Policy,
               out: list[Placement], waits: dict[int, str], reserved: bool,
               failed: set[Any]) -> tuple[bool, bool]:
    """A multi-GPU job in a baseline or peer: empty GPUs on one node (fewest-empty node first),
    none to share, or it waits and, blocked past ``policy.reserve_after_s``, reserves GPUs as
    plan() does. ``failed``: the round's set of what found no GPUs since they last changed;
    ("whole node", GPUs, memory) is added when this job finds no whole node, and the set is
    cleared when it changes the GPUs. Returns (whether a reservation is now held this round,
    whether the GPUs changed)."""
    whole = ("whole node", job.spec.gpus, need)
    keys = None if whole in failed else _whole_node(state, job.spec.gpus, need)
    if keys is None:
        waits[job.id] = "no whole node free"
        if not reserved and now - job.submitted_at >= policy.reserve_after_s:
            reserved = _reserve_baseline(state, job.spec.gpus)
            if reserved:
                failed.clear()
                return True, True
        failed.add(whole)   # none on these GPUs: a job as large and as big waits unlooked
        return reserved, False
    for k in keys:
        _take(state[k], job, need, 100.0)
        state[k][2] = True
    out.append(gang_placement(job.id, keys))
    failed.clear()
    return reserved, True


def gang_placement(job_id: int, keys: Sequence[tuple[str, int]]) -> Placement:
    """A placement on ``keys`` (node, GPU index), in order: the first node's GPUs, and a
    gang's other nodes in ``Placement.gang``."""
    nodes: dict[str, list[int]] = {}
    for n, i in keys:
        nodes.setdefault(n, []).append(i)
    (first, idx), *rest = nodes.items()
    return Placement(job_id, first, tuple(idx), gang=tuple((n, tuple(ix)) for n, ix in rest))


def _gang(free: Mapping[str, Sequence], size: Mapping[str, int], k: int
          ) -> list[tuple[str, int]] | None:
    """A job larger than any node: whole free nodes (``free``: node -> its free GPU indices,
    ``size``: node -> its GPUs), largest first then by name, all of each but the last, until
    they hold ``k`` GPUs; None if the wholly free nodes hold too few."""
    whole = sorted((n for n, idx in free.items() if len(idx) == size[n] and size[n] > 0),
                   key=lambda n: (-size[n], n))
    keys: list[tuple[str, int]] = []
    for n in whole:
        if len(keys) >= k:
            break
        keys += [(n, i) for i in sorted(free[n])[:k - len(keys)]]
    return keys if len(keys) >= k else None


def _take(st: list, job: Job, need: float, util: float) -> None:
    st[0] += 1
    st[1] -= need
    st[4] += util
    st[5].append(job.id)


def _whole_node(state: dict, k: int, need: float) -> list[tuple[str, int]] | None:
    by_node: dict[str, list[tuple[str, int]]] = {}
    for key, st in state.items():
        if st[0] == 0 and st[3] > 0 and st[1] >= need:
            by_node.setdefault(key[0], []).append(key)
    size = Counter(key[0] for key in state)
    if k > max(size.values(), default=0):   # larger than any node: a gang of whole nodes
        return _gang({n: [key[1] for key in keys] for n, keys in by_node.items()}, size, k)
    ok = [keys for keys in by_node.values() if len(keys) >= k]
    if not ok:
        return None
    fewest = min(ok, key=len)
    return sorted(fewest)[:k]


def _reserve_baseline(state: dict, k: int) -> bool:
    """plan()'s starvation guard for the baselines: drain the k least-busy GPUs of a node."""
    by_node: dict[str, list] = {}
    for key, st in state.items():
        if st[3] > 0:
            by_node.setdefault(key[0], []).append(key)
    if k > max((len(keys) for keys in by_node.values()), default=0):
        # a gang: drain the least-busy whole nodes until they hold k GPUs
        order = sorted(by_node, key=lambda n: (sum(state[key][0] for key in by_node[n]), n))
        held = 0
        for n in order:
            if held >= k:
                break
            for key in by_node[n]:
                state[key][3] = 0
            held += len(by_node[n])
        return held > 0
    best = None
    for node, keys in by_node.items():
        if len(keys) < k:
            continue
        keys = sorted(keys, key=lambda key: (state[key][0], key))[:k]
        score = (sum(state[key][0] for key in keys), node)
        if best is None or score < best[0]:
            best = (score, keys)
    if best is None:
        return False
    for key in best[1]:
        state[key][3] = 0       # cap 0: nothing new starts here this round
    return True


def _empty_first(fit: list, state: dict) -> tuple[str, int] | None:
    """An empty GPU on the node with the fewest empty GPUs, or None."""
    empty = [k for k in fit if state[k][0] == 0]
    if not empty:
        return None
    per_node: dict[str, int] = {}
    for k, st in state.items():
        if st[0] == 0:
            per_node[k[0]] = per_node.get(k[0], 0) + 1
    return min(empty, key=lambda k: (per_node[k[0]], k))


@register("packing", "least-loaded GPU that fits (empty first), interference-blind")
def _packing(ctx: PolicyContext) -> Planner:
    return _blind(ctx, lambda job, fit, state: min(fit, key=lambda k: (state[k][0], k)))


@register("random", "a uniformly random GPU that fits, interference-blind")
def _random(ctx: PolicyContext) -> Planner:
    rng = random.Random(f"random-{ctx.seed}")
    return _blind(ctx, lambda job, fit, state: rng.choice(fit))


@register("gandiva", "Gandiva (OSDI'18): empty GPU, else pack where summed utilisation is "
                     "lowest; interference-blind")
def _gandiva(ctx: PolicyContext) -> Planner:
    def choose(job, fit, state):
        return _empty_first(fit, state) or min(fit, key=lambda k: (state[k][4], state[k][0], k))
    return _blind(ctx, choose)


# --------------------------------------------------------------------------- Lucid
def lucid_score(p: Profile | None, memory_mib: float) -> int:
    """Lucid's sharing score: 0 tiny, 1 medium, 2 jumbo, from utilisation and memory."""
    if p is None:
        return 2
    mem = p.peak_mem_gib * 1024.0 / memory_mib if memory_mib else 1.0
    if p.gpu_util >= LUCID_UTIL_CUTS[1] or mem >= LUCID_MEM_CUTS[1]:
        return 2
    if p.gpu_util < LUCID_UTIL_CUTS[0] and mem < LUCID_MEM_CUTS[0]:
        return 0
    return 1


@register("lucid", "Lucid (ASPLOS'23): share only score-compatible pairs (utilisation and "
                   "memory classes), first compatible partner, only under pressure")
def _lucid(ctx: PolicyContext) -> Planner:
    policy, mem = ctx.policy, ctx.mem

    def planner(queue, slots, active, now, fairshare=None):
        state = _gpu_state(slots, active, ctx)
        total = {(s.node, s.index): s.memory_total_mib or 0.0 for s in slots}
        by_id = {j.id: j for j in active}
        for j in queue:
            by_id[j.id] = j
        started = {j.id: (j.started_at or 0.0, j.id) for j in active}

        def score(job_id: int, key) -> int:
            j = by_id[job_id]
            return lucid_score(ctx.profiles.get(j.spec.workload or ""), total[key])
        ordered = order_queue(queue, policy, now, fairshare)
        out: list[Placement] = []
        waits: dict[int, str] = {}
        reserved = False
        room = _has_room(state)
        # (workload, memory) of one-GPU jobs that found no GPU, and ("whole node", GPUs,
        # memory) of multi-GPU jobs that found no whole node
        failed: set[tuple] = set()
        for i, job in enumerate(ordered):
            if not room:
                break   # no GPU takes another job: the rest of the queue waits
            need = mem[job.id]
            if job.spec.gpus > 1:
                reserved, changed = _multi_gpu(state, job, need, now, policy, out, waits,
                                               reserved, failed)
                if changed:
                    room = _has_room(state)
                continue
            # GPUs unchanged since a like job found neither partner nor empty GPU: nor will
            # this one (pressure only falls further down the queue, and without it a job
            # looks only for an empty GPU)
            like = (job.spec.workload, need)
            if like in failed:
                waits[job.id] = "no compatible partner and no empty GPU"
                continue
            empties = sum(1 for st in state.values() if st[0] == 0 and st[3] > 0)
            pressure = len(ordered) - i > empties       # prescient adaptive sharing
            choice = None
            if pressure:
                partners = [k for k, st in state.items()
                            if st[0] == 1 and st[3] >= 2 and not st[2] and st[1] >= need
                            and st[5][0] in by_id
                            and score(st[5][0], k) + score(job.id, k) <= 2]
                if partners:
                    choice = min(partners, key=lambda k: (started.get(state[k][5][0],
                                                                      (now, state[k][5][0])), k))
            if choice is None:
                fit = [k for k, st in state.items() if st[0] == 0 and st[3] > 0 and st[1] >= need]
                choice = _empty_first(fit, state) if fit else None
            if choice is None:
                waits[job.id] = "no compatible partner and no empty GPU"
                failed.add(like)
                continue
            _take(state[choice], job, need, _util(ctx.profiles, job))
            started[job.id] = (now, job.id)
            out.append(Placement(job.id, choice[0], (choice[1],)))
            failed.clear()
            room = _has_room(state)
        return Plan(tuple(out), waits)
    planner.full = _full_at(PEER_MAX_JOBS)   # type: ignore[attr-defined]
    return planner


# --------------------------------------------------------------------------- Tiresias
_submitted = attrgetter("submitted_at", "id")
_job_id = attrgetter("id")

def tiresias_queue(attained_gpu_s: float) -> int:
    """Tiresias's discretised queue: 0 below the limit, 1 from it."""
    return 0 if attained_gpu_s < TIRESIAS_Q1_GPU_S else 1


@register("tiresias", "Tiresias (NSDI'19): preemptive two-queue least-attained-service, "
                      "one job per GPU")
def _tiresias(ctx: PolicyContext) -> Planner:
    view = ctx.view

    def planner(queue, slots, active, now, fairshare=None):
        # Tiresias ranks by attained service alone: its own notion of fairness, so fair
        # share's points do not reorder it (POLICY+fs equals POLICY for tiresias)
        def rank(j: Job) -> tuple:
            return (tiresias_queue(view.attained.get(j.id, 0.0)), j.submitted_at, j.id)
        capacity = sum(1 for s in slots if s.max_jobs > 0)
        # the queue in rank order, lazily (the simulated queue may be thousands long and
        # only its head is read): by submission, queue 0 first; a job that has attained no
        # service is in queue 0 without a look-up
        by_submit = queue.ranked() if isinstance(queue, RankedQueue) else \
            sorted(queue, key=_submitted)
        attained = view.attained

        # queue 1: attained service at the limit or beyond (one pass in C, no call per job)
        late = list(map(TIRESIAS_Q1_GPU_S.__le__,
                        map(attained.get, map(_job_id, by_submit), itertools.repeat(0.0))))

        def in_rank_order(jobs: Sequence[Job]):
            yield from itertools.compress(jobs, map(operator.not_, late))
            yield from itertools.compress(jobs, late)
        chosen: set[int] = set()
        first: list[Job] = []   # the queued jobs chosen, in rank order
        running = {j.id for j in active}
        used = 0
        for j in heapq.merge(sorted(active, key=rank), in_rank_order(by_submit), key=rank):
            if used >= capacity:
                break   # every GPU spoken for: no later job is chosen
            if used + j.spec.gpus <= capacity:
                chosen.add(j.id)
                used += j.spec.gpus
                if j.id not in running:
                    first.append(j)
        preempt = tuple(sorted(j.id for j in active if j.id not in chosen))
        gone = set(preempt)
        free: dict[str, list[int]] = {}
        for s in slots:
            if s.max_jobs > 0 and not [i for i in s.job_ids if i not in gone]:
                free.setdefault(s.node, []).append(s.index)
        size = Counter(s.node for s in slots if s.max_jobs > 0)
        biggest = max(size.values(), default=0)
        out, waits = [], {}
        # chosen jobs first (in rank order), then backfill with the rest
        rest = (j for j in in_rank_order(by_submit) if j.id not in chosen)
        for job in itertools.chain(first, rest) if any(free.values()) else ():
            if not any(free.values()):
                break   # no free GPU left: the rest wait
            k = job.spec.gpus
            if k > biggest:   # a gang of whole free nodes
                keys = _gang(free, size, k)
                if keys is None:
                    waits[job.id] = "no whole nodes free (least-attained-service order)"
                    continue
                for n, i in keys:
                    free[n].remove(i)
                out.append(gang_placement(job.id, keys))
                continue
            nodes = [n for n, idx in free.items() if len(idx) >= k]
            if not nodes:
                waits[job.id] = "no free GPUs (least-attained-service order)"
                continue
            node = min(nodes, key=lambda n: (len(free[n]), n))
            take = sorted(free[node])[:k]
            free[node] = [i for i in free[node] if i not in take]
            out.append(Placement(job.id, node, tuple(take)))
        return SimPlan(tuple(out), waits, preempt)
    # re-planned when a running job reaches the queue limit (sim/engine.py), as Tiresias's
    # scheduler demotes a job the moment it crosses it, not at the next arrival
    planner.thresholds = (TIRESIAS_Q1_GPU_S,)   # type: ignore[attr-defined]
    return planner


# --------------------------------------------------------------------------- helpers for stats
def t95(df: int) -> float:
    """Two-sided 95 % Student-t quantile for ``df`` degrees of freedom (table; normal beyond)."""
    table = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201,
             2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074,
             2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
    if df < 1:
        return float("nan")
    return table[df - 1] if df <= len(table) else 1.96


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (t; 0 for one value)."""
    x = [float(v) for v in values]
    if not x:
        return math.nan, math.nan
    if len(x) == 1:
        return x[0], 0.0
    return statistics.fmean(x), t95(len(x) - 1) * statistics.stdev(x) / math.sqrt(len(x))

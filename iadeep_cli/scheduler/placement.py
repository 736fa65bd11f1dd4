"""Where queued jobs go: a pure function of (queue, GPU slots, running jobs, predictor, policy).

No I/O, no clock, no globals: the controller and the simulator call the same ``plan()``, so what
the simulator measures says something about the real scheduler.

How a round decides (docs/scheduling.md 'How placement decides'):

1. Queue order: effective priority = priority + ``aging_per_hour`` x hours waited (+ the
   owner's fair-share points, when the lab turns fair share on), then submission time, then
   id (``scheduler/priority.py``; a user or array over its limit waits:
   ``scheduler/limits.py``). Jobs that cannot start do not block the ones behind them
   (backfill), except that the first job that needs *whole* GPUs (multi-GPU, ``exclusive``,
   or not yet profiled) and is blocked by busy GPUs reserves them: later jobs may not take or
   join those GPUs, so the GPUs drain and it cannot starve behind a stream of small jobs;
   the node held is the one expected to free first (its jobs' expected remaining run time,
   ``scheduler/remaining.estimate_runtime``), and a job expected to end before the held GPUs
   are needed may still use them. With ``Policy.preemption`` "las" the queue goes by
   attained-service level first and requeueable jobs ranked after a waiting job, and expected
   to run longer than it, are preempted for it (``Plan.preempt``; ``_Room``). A gang
   (``gangs=True``: a job larger than any node) holds, or has preempted for it, whole nodes.
2. Memory: a job needs ``--mem`` (JobSpec.mem_gib) or its profile's peak plus
   ``memory_margin_gib`` free on the GPU; the free figure already counts foreign processes.
3. Sharing pays only when the predictor says so: the combined predicted speed of the GPU's jobs
   is at least ``share_threshold`` *and* higher than without the newcomer, and no job falls below
   its floor (JobSpec.min_speed, else ``Policy.min_speed``). At most ``max_jobs_per_gpu`` jobs
   (per-node override). ``Policy.sharing: jct`` judges a group by the completion time it
   saves instead (``scheduler/sharing.py``). Jobs without a known profile, exclusive jobs and
   multi-GPU jobs never share (multi-GPU jobs get empty GPUs on one node).
4. Choice among feasible GPUs (IADeep-style, checked with ``iadeep sim``): while there are more
   empty GPUs than jobs still waiting behind this one, a job takes an empty GPU (running alone
   is fastest for it and nobody is waiting for the GPU). Under pressure (at least as many GPUs
   wanted by jobs behind it that could start now as empty GPUs) it joins the GPU where it
   adds the most predicted throughput, and the empty GPUs stay for jobs that cannot share
   well (two heavy jobs together lose: ~0.92).
   Empty GPUs are taken from the node with the fewest empty GPUs, keeping whole nodes free for
   multi-GPU jobs.
5. Run-time adaptation (``scheduler/detectors.py``): a GPU in ``closed`` (its jobs underperform
   what was predicted) takes no new partner, and a job that would have gone there says why.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..jobopts import node_allowed, node_rules
from ..jobs import Job, JobSpec
from ..profiles import Profile, gpu_model_key
from ..settings import Inventory, Policy
from ..snapshot import ClusterSnapshot
from ..text import MIB_PER_GIB, gib, gpus_at
from . import reservations as reserve
from .gpumodels import ModelSpeeds, preference, queue_means
from .inputs import PlanInputs
from .limits import array_limit_reason, charge, usage_of, user_limit_reason
from .prediction import CachedModel, Predict
from .priority import RankedQueue, order_queue, placement_fields, queue_key
from .remaining import Durations, RuntimeEstimate, estimate_runtime, gittins
from .sharing import Pressure, best_share, completion_rate

# A job whose memory is unknown (no profile, no --mem) starts only on an empty GPU with at least
# this fraction of its memory free: a GPU mostly taken by someone else's process would OOM it.
UNKNOWN_NEED_FREE = 0.5
# ``sharing: jct``: GPUs whose residents' completion indexes agree within this step (in log,
# 25%) are judged as one (they would be decided alike), so a round stays fast
INDEX_STEP = math.log(1.25)
NO_HISTORY = Durations()   # no run times given: the prior alone (memoised across rounds)
# Backfill on held GPUs: a job may take GPUs held for a waiting job only if this quantile of
# its run time (scheduler/remaining.estimate_runtime: "seconds", the median, or "high_s") ends
# before the holder is expected to need them, and only if the estimate rests on something
# (--time or history): a job nobody knows anything about is not expected to end soon.
BACKFILL_BY = "seconds"
# Policy.preemption "las": levels of attained service (GPU-seconds over every attempt); a job
# waits ahead of every job of a higher level, and may have requeueable jobs of a higher level
# preempted for it (Tiresias's discretised least-attained-service queues, NSDI'19).
LAS_LEVELS_GPU_S = (3600.0,)
# a job is not preempted again before it has run this long in its current attempt (its
# checkpoint and restart would cost more than the waiting job gains)
MIN_ATTEMPT_S = 60.0
# within a level: "fifo" (the usual order) or "gittins" (the job likeliest to finish per GPU
# second first, from its owner's and label's run times: Tiresias's 2D-Gittins, learnt)
LAS_ORDER = "fifo"
# under "las", a gang (a job larger than any node, ``plan(..., gangs=True)``) is ranked like
# any job: requeueable jobs ranked after it are preempted for it on whole nodes, and once it
# has had more service it may be preempted in turn (Tiresias does both). False: a gang is
# never preempted and nothing is preempted for it (it waits for whole nodes to drain)
GANG_LAS = True
# under "las": a running job is preempted for a waiting one only if it is expected to run
# longer than the waiting job (the median of each estimate, the running job's given the
# service it has had), unless nothing is known of the waiting job's run time (then LAS's
# bet that a new job is short stands); False: by levels alone, as Tiresias
PREEMPT_SHORTER = True
# a gang that has waited ``Policy.reserve_after_s`` holds the whole nodes expected to empty
# first (``_reserve_gang``), as a one-node job holds GPUs, when plan() is given run times
# (``durations``): with nothing known of run times no job could backfill the held nodes,
# and a gang could idle a whole cluster for days. False: it holds nothing
GANG_HOLD = True
# A blocked whole-GPU job reserves GPUs only after waiting Policy.reserve_after_s (default 1 h):
# reserving at once left GPUs idle while they drained and cost 'exclusive' and 'iadeep' ~10-20%
# average JCT in the simulator; after an hour the reservation still bounds its wait.


# --------------------------------------------------------------------------- values
@dataclass(frozen=True)
class GpuSlot:
    """One schedulable GPU as the planner sees it: memory, iadeep jobs on it, capacity."""

    node: str
    index: int
    memory_total_mib: float | None
    memory_free_mib: float | None     # already net of foreign processes and our own jobs
    job_ids: tuple[int, ...] = ()
    max_jobs: int = 2
    foreign_mib: float = 0.0
    labels: tuple[str, ...] = ()      # its node's inventory labels (--constraint matches them)
    gpu_model: str = ""               # short model key (profiles.gpu_model_key): "h200", "a100"

    @property
    def name(self) -> str:
        return f"{self.node}:{self.index}"


@dataclass(frozen=True)
class Placement:
    """Start ``job_id`` on ``node`` GPUs ``gpu_indices``; predicted speeds of it and neighbours."""

    job_id: int
    node: str
    gpu_indices: tuple[int, ...]
    predicted_speeds: dict[int, float] = field(default_factory=dict)
    note: str = ""   # why this GPU model, on a cluster of several ('' otherwise)
    # a gang (``plan(..., gangs=True)``: a job larger than any node): its GPUs on the other
    # nodes, (node, GPU indices) each; empty for a job on one node
    gang: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def gpu_keys(self) -> list[tuple[str, int]]:
        """Every (node, GPU index) it takes, the gang's other nodes included."""
        return [(self.node, i) for i in self.gpu_indices] + [
            (n, i) for n, idx in self.gang for i in idx]


@dataclass(frozen=True)
class Plan:
    """One round's outcome: what starts now, why every other queued job waits, and which
    running jobs to checkpoint and requeue (``preempt``: only jobs whose ``spec.requeue`` is
    set, and only when ``Policy.preemption`` is not "off"; their GPUs are not given to anyone
    in this round: the next round, once they left, places the jobs they made room for)."""

    placements: tuple[Placement, ...]
    waits: dict[int, str]
    preempt: tuple[int, ...] = ()


# --------------------------------------------------------------------------- snapshot -> slots
def spec_memory_mib(spec: JobSpec, profiles: Mapping[str, Profile], policy: Policy
                    ) -> float | None:
    """Expected GPU memory per GPU: ``--mem``, else profile peak + margin, else unknown (None).
    The one memory rule: the placer's and the simulator's (``sim.engine``)."""
    if spec.mem_gib is not None:
        return spec.mem_gib * MIB_PER_GIB
    prof = profiles.get(spec.workload) if spec.workload else None
    if prof is None:
        return None
    return (prof.peak_mem_gib + policy.memory_margin_gib) * MIB_PER_GIB


def job_memory_mib(job: Job, profiles: Mapping[str, Profile], policy: Policy) -> float | None:
    return spec_memory_mib(job.spec, profiles, policy)


def slots_from_snapshot(snapshot: ClusterSnapshot, active_jobs: Sequence[Job],
                        inventory: Inventory,
                        profiles: Mapping[str, Profile] | None = None) -> tuple[GpuSlot, ...]:
    """Schedulable GPUs: inventory nodes that answered, restricted to ``Node.gpus``.

    A job that just started may not show in nvidia-smi yet, or not at its full size: the part
    of its expected memory (from ``profiles`` or ``--mem``) that the GPU does not show it using
    yet is subtracted from the free figure, so the next round does not overfill the GPU.
    """
    profiles = profiles or {}
    policy = inventory.policy
    by_gpu: dict[tuple[str, int], list[Job]] = {}
    for job in active_jobs:
        for idx in job.gpu_indices:
            by_gpu.setdefault((job.node or "", idx), []).append(job)
    slots: list[GpuSlot] = []
    for node in inventory.nodes:
        snap = snapshot.node(node.name)
        if snap is None or not snap.placeable:
            continue
        max_jobs = node.max_jobs_per_gpu or policy.max_jobs_per_gpu
        for gpu in snap.gpus:
            if node.gpus is not None and gpu.index not in node.gpus:
                continue
            jobs_here = by_gpu.get((node.name, gpu.index), [])
            free = gpu.free_mib
            if free is not None:
                for job in jobs_here:   # memory it will still grow into (or not show yet)
                    seen = sum(p.used_memory_mib or 0.0 for p in gpu.processes
                               if p.job_id == job.id)
                    free -= max(0.0, (job_memory_mib(job, profiles, policy) or 0.0) - seen)
            foreign = sum(p.used_memory_mib or 0.0 for p in gpu.foreign_processes)
            slots.append(GpuSlot(node.name, gpu.index, gpu.memory_total_mib, free,
                                 tuple(sorted(j.id for j in jobs_here)), max_jobs, foreign,
                                 node.labels, gpu_model_key(gpu.name)))
    return tuple(slots)


# --------------------------------------------------------------------------- round state
class _Gpu:
    """Mutable working copy of a slot during one round."""

    __slots__ = ("node", "index", "free", "total", "residents", "max_jobs", "reserved",
                 "foreign", "labels", "model", "need_at")

    def __init__(self, slot: GpuSlot):
        self.node = slot.node
        self.index = slot.index
        self.free = slot.memory_free_mib
        self.total = slot.memory_total_mib
        self.max_jobs = max(1, slot.max_jobs)
        self.residents: list[_Res] = []
        self.reserved = False
        self.need_at = 0.0   # held: when its holder is expected to need it (backfill before)
        self.foreign = slot.foreign_mib
        self.labels = frozenset(slot.labels)
        self.model = slot.gpu_model

    @property
    def name(self) -> str:
        return f"{self.node}:{self.index}"

    def fits(self, need: float | None) -> bool:
        if need is None:   # unknown needs: an empty GPU with most of its memory free
            return not self.residents and (self.free is None or self.total is None
                                           or self.free >= UNKNOWN_NEED_FREE * self.total)
        if self.free is None:
            return not self.residents
        return self.free >= need

    def could_ever_fit(self, need: float | None) -> bool:
        """Whether the job fits once this GPU empties (foreign load comes and goes too)."""
        return need is None or self.total is None or self.total >= need


@dataclass(frozen=True)
class _Res:
    """A job on a GPU as far as sharing is concerned."""

    job_id: int
    profile: Profile | None   # None: unknown workload, nothing may join it
    floor: float
    solo_only: bool           # exclusive or multi-GPU
    # ``sharing: jct`` (scheduler/remaining.py): its completion index, the bucket it falls in
    # (GPUs whose residents' buckets match are judged once), how long it has run, and the run
    # time it has left on average (for the reasons)
    index: float = 0.0
    bucket: int = 0
    age: float = 0.0
    left: float = 0.0

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.profile.workload if self.profile else "", self.floor, self.bucket)


def _sig(residents: Sequence[_Res]) -> tuple[Any, ...]:
    return tuple(sorted(r.key for r in residents))


class _Round:
    """Book-keeping for one plan() call: which GPUs are empty, which can take a sharer."""

    def __init__(self, slots: Sequence[GpuSlot], residents: Mapping[int, _Res],
                 closed: Mapping[str, str] | None = None):
        self.gpus = [_Gpu(s) for s in slots]
        self.closed = dict(closed or {})   # GPU name -> why it takes no partners
        # those GPUs, in slot order, looked up once (a waiting job's reason names the first it
        # could otherwise join: no pass over every GPU's name for every job)
        self.closed_gpus = [g for g in self.gpus if g.name in self.closed]
        self._closed_ids = {id(g) for g in self.closed_gpus}
        self.empty: dict[str, dict[int, _Gpu]] = {}        # node -> index -> gpu
        # (GPU model, resident signature) -> id(gpu) -> gpu: GPUs whose residents predict the
        # same speeds, per model so a job trying one model skips the others' wholesale
        self.shareable: dict[tuple[Any, ...], dict[int, _Gpu]] = {}
        self.shareable_count = 0   # GPUs in ``shareable`` (has_room asks once per job)
        self.empty_count = 0
        # the largest GPU memory anywhere: fixed for the round, so whether a job could ever
        # fit is one comparison, not a pass over every GPU (that pass was 60% of a round at
        # 1,000 jobs x 512 GPUs: benchmarks/bench_schedule.py)
        self.largest = _largest(self.gpus)
        # ``sharing: jct`` (scheduler/sharing.py): the running jobs' completion rate, and for
        # the job being placed its expected wait and the GPUs wanted behind it
        self.rate = 0.0
        self.wait_s = 0.0
        self.behind = 0
        self.held: list[_Gpu] = []   # GPUs reserved this round (for backfill)
        for g, slot in zip(self.gpus, slots):
            g.residents = sorted((residents[j] for j in slot.job_ids if j in residents),
                                 key=lambda r: r.key)
            self._index(g)

    def _index(self, g: _Gpu) -> None:
        if g.reserved:
            return
        if not g.residents:
            self.empty.setdefault(g.node, {})[g.index] = g
            self.empty_count += 1
        elif len(g.residents) < g.max_jobs and id(g) not in self._closed_ids and all(
                r.profile is not None and not r.solo_only for r in g.residents):
            same = self.shareable.setdefault((g.model, _sig(g.residents)), {})
            self.shareable_count += id(g) not in same
            same[id(g)] = g

    def _unindex(self, g: _Gpu) -> None:
        if not g.residents:
            gpus = self.empty.get(g.node, {})
            if gpus.pop(g.index, None) is not None:
                self.empty_count -= 1
            if not gpus:
                self.empty.pop(g.node, None)
        else:
            if self.shareable.get((g.model, _sig(g.residents)), {}).pop(id(g), None) is not None:
                self.shareable_count -= 1

    def add(self, g: _Gpu, res: _Res, need: float | None) -> None:
        self._unindex(g)
        g.residents.append(res)
        g.residents.sort(key=lambda r: r.key)   # same signature -> same order -> same speeds
        if g.free is not None and need is not None:
            g.free -= need
        self._index(g)

    def reserve(self, gs: Sequence[_Gpu], need_at: float = 0.0) -> None:
        self.held = [*self.held, *gs]
        for g in gs:
            self._unindex(g)
            g.reserved = True
            g.need_at = need_at

    def open_held(self, until: float) -> list[_Gpu]:
        """Backfill: offer the held GPUs a job expected to end by ``until`` may use (those
        needed no sooner); ``close_held`` takes back the ones it did not take."""
        opened = [g for g in self.held if g.reserved and g.need_at >= until]
        for g in opened:
            g.reserved = False
            self._index(g)
        return opened

    def close_held(self, opened: Sequence[_Gpu]) -> None:
        for g in opened:
            self._unindex(g)
            g.reserved = True

    def n_empty(self) -> int:
        return self.empty_count

    def has_room(self) -> bool:
        return self.empty_count > 0 or self.shareable_count > 0

    def held_room(self) -> bool:
        """Whether a held GPU could take a job if opened to it (backfill): one with fewer
        jobs than its ``max_jobs`` (a superset of what ``has_room`` would then find)."""
        return any(len(g.residents) < g.max_jobs for g in self.held)


# --------------------------------------------------------------------------- the policy
def plan(queue: Sequence[Job], slots: Sequence[GpuSlot], active: Sequence[Job], now: float,
         inputs: PlanInputs) -> Plan:
    """Decide which queued jobs start where; every job left waiting gets a readable reason.

    ``queue``, ``slots``, ``active``, ``now``: the state the round sees; ``inputs``: what it
    decides by (``scheduler/inputs.PlanInputs``: profiles, predictor, policy, limits, fair
    share, closed GPUs, speeds per GPU model, run times, reservations, attained service,
    gangs, reasons), built once by the caller. ``queue`` may be a ``priority.RankedQueue``
    (kept in submission order by a caller that plans round after round, the simulator): the
    plan is the same as for a list of the same jobs, found without sorting the queue again
    and, in a short round (``reasons`` off), without passing over its alike tail.
    """
    profiles, model, policy = inputs.profiles, inputs.model, inputs.policy
    user_limits, fairshare, closed = inputs.user_limits, inputs.fairshare, inputs.closed
    speeds, durations, reservations = inputs.speeds, inputs.durations, inputs.reservations
    attained, gangs, reasons = inputs.attained, inputs.gangs, inputs.reasons
    history = durations
    predict = model.predict_group if isinstance(model, CachedModel) else \
        CachedModel(model).predict_group
    if policy.sharing != "jct":
        durations = None
    elif durations is None:
        durations = NO_HISTORY
    residents = {j.id: _resident(j, profiles, policy, durations, now) for j in active}
    rnd = _Round(slots, residents, closed)
    usage = usage_of(active)
    total_gpus = len(slots)
    placements: list[Placement] = []
    waits: dict[int, str] = {}
    holder: int | None = None     # the job this round's reservation is for (at most one)
    ordered = order_queue(queue, policy, now, fairshare)
    las = policy.preemption == "las" and attained is not None
    room = _Room(rnd, active, policy, now, fairshare, attained, history) \
        if las and attained is not None else None
    if room is not None:
        ordered.sort(key=room.level)   # stable: the usual order kept within a level
    ests = _Estimates(history, now, active, queue)
    # under "las" with every running job requeueable, preemption stands in for reservations
    # (a job that waits long enough ranks before the jobs it waits for and takes their GPUs):
    # held GPUs cost 10% of the mean JCT on the 8-GPU tuning window (docs/simulator.md)
    reserving = room is None or not all(j.spec.requeue for j in active)
    mixed = _ModelRound.of(slots, ordered, speeds)
    node_size = Counter(g.node for g in rnd.gpus) if gangs else Counter()
    biggest = max(node_size.values(), default=0)
    tasks_active = Counter(j.array_id for j in active if j.array_id is not None)
    pressure = Pressure(ordered, tasks_active, usage, user_limits,
                        lambda j: _could_run(rnd, j, profiles, policy))
    if durations is not None:
        rnd.rate = completion_rate(rnd.gpus, predict)
    ahead = 0     # startable jobs earlier in the order left waiting (``sharing: jct``'s wait)
    # reservations: which GPUs each holds this round (scheduler/reservations.py)
    kept_for = reserve.assign(reservations, slots, {j.id: j.owner for j in active}, now)
    # ``reasons`` off, one GPU model, the threshold rule, no reservations: a one-GPU job
    # like one that could not start (same workload, memory, floor, no node rule) cannot start
    # either until something is placed; such jobs are passed over (long simulated queues).
    # Both this and the stop below assume that a job that could not start means that jobs
    # like it cannot either. Under "las" that is false (``room`` preempts for a job even when
    # no GPU has room): both are off. While the round holds GPUs for a waiting job
    # (``rnd.held``) each job may backfill them by its own estimate: only jobs offered the
    # same held GPUs (the same backfill horizon) are alike, and the round stops only once no
    # held GPU could take a job either
    failed: set[tuple[Any, ...]] | None = set() if (
        not reasons and durations is None and mixed is None and not reservations
        and room is None) else None
    # a queue kept ranked by the caller (``RankedQueue``), in the order it is placed in, with
    # no limits that could stop a job before the alike test: once every alike class still to
    # come is one that could not start, the rest of the round would pass over them alone
    rest_of: RankedQueue | None = queue if (
        failed is not None and isinstance(queue, RankedQueue) and not fairshare
        and policy.aging_per_hour >= 0 and queue.one_priority() and not queue.has_arrays()
        and not user_limits) else None
    for i, job in enumerate(ordered):
        if not reasons and room is None and not rnd.has_room() and not rnd.held_room():
            break   # nothing more can start this round (room only shrinks as jobs are placed)
        rnd.wait_s = (ahead + 1) / rnd.rate if rnd.rate > 0 else 0.0
        limit = array_limit_reason(job, tasks_active) or \
            user_limit_reason(job, usage, user_limits)
        if limit:
            waits[job.id] = limit
            continue
        # with GPUs held, a job like one that could not start may still backfill them by a
        # shorter estimate: only a job that would be offered the same held GPUs is alike
        like = _like(job, ests if rnd.held else None) if failed is not None else ()
        if failed is not None and like in failed:
            continue
        res = _resident(job, profiles, policy, durations, now)
        need = job_memory_mib(job, profiles, policy)
        whole = job.spec.gpus > 1 or res.solo_only or res.profile is None
        ok = _node_rule(job)
        if ok is not _anywhere and not any(ok(g) for g in rnd.gpus):
            waits[job.id] = (f"no node it may run on ({node_rules(job.spec)}) has GPUs to "
                             f"offer now {UNOFFERED}")
            continue
        # reservations: ``ok`` less GPUs held for others (``rule``: the job's own node rules)
        rule, (ok, kept) = ok, reserve.rule(reservations, kept_for, job, ok, now)
        # backfill: GPUs held for a waiting job are open to this one if it is expected to end
        # before they are needed
        # (a gang never backfills: it takes only wholly empty nodes)
        gang = gangs and job.spec.gpus > biggest
        opened = rnd.open_held(now + ests.backfill_s(job)) if rnd.held and not gang else []
        if not rnd.has_room():
            got, why = None, _full_reason(job, total_gpus)
        else:
            never = _never_fits(rnd, need, rule)
            if never:
                rnd.close_held(opened)
                waits[job.id] = never
                continue
            # only ``sharing: jct`` weighs how many GPUs are wanted behind; the threshold
            # rule asks whether they are at least the empty GPUs (a lookahead that stops there)
            behind = rnd.behind = pressure.behind(i) if durations is not None else \
                pressure.at_least(i, rnd.n_empty())
            if gang:
                got, why = _place_gang(rnd, job, res, need, ok, node_size)
            elif mixed is not None:
                got, why = mixed.place(rnd, job, res, need, predict, policy, behind, ok, whole)
            elif whole:
                got, why = _place_whole(rnd, job, res, need, ok)
            else:
                got, why = _place_single(rnd, job, res, need, predict, policy, behind, ok)
        if opened:   # held again, with the job that backfilled them if it did
            rnd.close_held(opened)
        if got is None and room is not None:
            made = room.make(job)   # preempting jobs ranked after it, if that makes room
            if made:
                waits[job.id] = made
                ahead += pressure.wants(i) > 0
                continue
        if got is None:
            held_by = holder
            # (a gang holds whole nodes; under "las" with every job requeueable it makes
            # room by preemption instead, like any job: ``GANG_LAS``)
            if whole and total_gpus and reserving and (
                    not gang or (GANG_HOLD and history is not None)):
                note, holder = _reservation(rnd, job, need, policy.reserve_after_s
                                            - (now - job.submitted_at), holder, ok, ests,
                                            node_size if gang else None)
                why += note
            if not whole and rnd.closed:
                why += _closed_note(rnd, ok)
            why += kept   # the reservations that keep it off GPUs, if any
            if rule is not _anywhere:
                allowed = sorted({g.node for g in rnd.gpus if ok(g)})
                why += f" (it may run only on {', '.join(allowed)}: {node_rules(job.spec)})"
            waits[job.id] = why
            if durations is not None:   # only ``sharing: jct`` weighs the wait (rnd.rate)
                ahead += pressure.wants(i) > 0
            if failed is not None:
                if holder != held_by:   # it reserved GPUs: the round changed
                    failed.clear()
                elif rule is _anywhere and (not whole or holder is not None
                                            or rest_of is not None):
                    # (a whole job only once no other may reserve; in submission order a
                    # whole job that did not reserve has none alike after it that would:
                    # none is older, and the GPUs it found are theirs)
                    failed.add(like)
                    if rest_of is not None and all(
                            _like(j, ests if rnd.held else None) in failed
                            for j in rest_of.last_of_classes_after(job)):
                        break   # every job after this one is like one that could not start
            continue
        if failed is not None:
            failed.clear()   # GPUs changed: every job may try again
        placements.append(got)
        if job.array_id is not None:
            tasks_active[job.array_id] += 1
        charge(usage, job.owner, set(got.gpu_keys()))
    preempt = tuple(sorted(room.victims)) if room is not None else ()
    return Plan(tuple(placements), waits, preempt)


def _like(job: Job, ests: _Estimates | None) -> tuple[Any, ...]:
    """What a short round calls jobs alike by: their spec's placement fields and, while
    the round holds GPUs (``ests`` given), the backfill horizon they would be offered."""
    return (placement_fields(job.spec), ests.backfill_s(job) if ests is not None else None)


def _level(attained_gpu_s: float) -> int:
    """The least-attained-service level of a job that has had this much GPU time."""
    return sum(1 for cut in LAS_LEVELS_GPU_S if attained_gpu_s >= cut)


class _Estimates:
    """Run-time estimates for one round (``remaining.estimate_runtime``), memoised per job:
    how long a queued job would run, and when a running job is expected to end."""

    def __init__(self, history: Durations | None, now: float, active: Sequence[Job],
                 queue: Sequence[Job] = ()):
        self.history = history
        self.now = now
        self.active = {j.id: j for j in active}
        self._queue = queue   # placed this round: their whole run is left (``queued``)
        self._queued: dict[int, Job] | None = None
        self._left: dict[int, float] = {}
        self._backfill: dict[tuple[Any, ...], float] = {}
        self.guessed: set[int] = set()   # jobs whose estimate is the stated default alone

    def estimate(self, job: Job, age_s: float = 0.0) -> RuntimeEstimate:
        spec = job.spec
        return estimate_runtime(self.history, user=job.owner, workload=spec.workload,
                                time_limit_s=spec.time_limit_s, age_s=age_s)

    def backfill_s(self, job: Job) -> float:
        """How long ``job`` must be expected to run for backfill (inf: nothing known);
        memoised per owner, label and time limit (all a new job's estimate reads)."""
        spec = job.spec
        key = (job.owner, spec.workload, spec.time_limit_s)
        hit = self._backfill.get(key)
        if hit is None:
            est = self.estimate(job)
            hit = math.inf if est.source == "default" else float(getattr(est, BACKFILL_BY))
            self._backfill[key] = hit
        return hit

    def left_s(self, job_id: int) -> float:
        """A running job's expected run time still to go (its median given its age)."""
        hit = self._left.get(job_id)
        if hit is None:
            job = self.active.get(job_id)
            if job is None:   # placed this round: as a new job
                if self._queued is None:   # built once, when first needed (queues are long)
                    self._queued = {j.id: j for j in self._queue}
                new = self._queued.get(job_id)
                est = self.estimate(new) if new is not None else None
                hit = est.seconds if est is not None else 0.0
                if est is not None and est.source == "default":
                    self.guessed.add(job_id)
            else:
                age = self.now - job.started_at if job.started_at is not None else 0.0
                est = self.estimate(job, age)
                hit = est.left_s(age)
                if est.source == "default":
                    self.guessed.add(job_id)
            self._left[job_id] = hit
        return hit

    def free_in(self, g: _Gpu) -> float:
        """When GPU ``g`` is expected to empty: its last job's expected end, from now."""
        return max((self.left_s(r.job_id) for r in g.residents), default=0.0)


class _Room:
    """``Policy.preemption: las`` for one round. A job left waiting for GPUs (in queue order)
    may have running requeueable jobs preempted for it: those that rank after it (a higher
    attained-service level, or the same level and later in the queue's order, i.e. they
    started by backfill) and whose GPUs, with the empty ones, make room for it on one node;
    the fewest GPUs, the latest-ranked first. A job is preempted only after ``MIN_ATTEMPT_S``
    in its attempt. The GPUs made room on are held for the rest of the round (no job behind it
    takes them: the preempted jobs must checkpoint and leave first, and the next round places
    it), and its wait reason says whom it waits for."""

    def __init__(self, rnd: _Round, active: Sequence[Job], policy: Policy, now: float,
                 fairshare: Mapping[str, float] | None, attained: Mapping[int, float],
                 history: Durations | None = None):
        self.history = history
        self._index: dict[tuple[Any, ...], int] = {}
        self.rnd = rnd
        self.now = now
        self.policy = policy
        self.fairshare = fairshare
        self.attained = attained
        self.by_id = {j.id: j for j in active}
        self.ranks = {j.id: self.rank(j) for j in active}
        # a gang (a job larger than any node, ``plan(..., gangs=True)``): with ``GANG_LAS``
        # preempted and preempted for on whole nodes, else neither
        self.node_max = max(Counter(g.node for g in rnd.gpus).values(), default=0)
        self.victims: set[int] = set()
        self._left: dict[int, float] = {}
        self.for_s = math.inf

    def level(self, j: Job) -> tuple[Any, ...]:
        """Its attained-service level; with ``LAS_ORDER`` "gittins" and history, then its
        completion index from its owner's and label's run times (higher first, in 25% steps)."""
        got = self.attained.get(j.id, 0.0)
        lvl = _level(got)
        if LAS_ORDER != "gittins" or self.history is None:
            return (lvl,)
        per_gpu = got / max(1, j.spec.gpus)
        age = 0 if per_gpu < 60 else int(math.log(per_gpu / 60.0) / math.log(1.25)) + 1
        key = (j.owner, j.spec.workload, j.spec.time_limit_s, age)
        hit = self._index.get(key)
        if hit is None:
            d, _ = self.history.runtime_dist(j.owner, j.spec.workload)
            lo = 0.0 if age == 0 else 60.0 * 1.25 ** (age - 1)
            g = gittins(d, j.spec.time_limit_s, lo) / max(1, j.spec.gpus)
            hit = self._index[key] = -round(math.log(g) / INDEX_STEP) if g > 0 else 10**6
        return (lvl, hit)

    def rank(self, j: Job) -> tuple[Any, ...]:
        """Its place in the queue's order (levels first), for running jobs as for queued."""
        return (*self.level(j), *queue_key(
            j.spec.priority, j.owner, j.submitted_at, j.id, self.now,
            self.policy.aging_per_hour, self.fairshare))

    def _movable(self, jid: int, mine: tuple[Any, ...]) -> bool:
        j = self.by_id.get(jid)
        return (j is not None and j.spec.requeue and jid not in self.victims
                and (GANG_LAS or j.spec.gpus <= self.node_max)
                and self.ranks[jid] > mine
                and j.started_at is not None and self.now - j.started_at >= MIN_ATTEMPT_S
                and self._outlasts(j))

    def _outlasts(self, j: Job) -> bool:
        """Whether running job ``j`` is expected to run longer than the job preempting for
        (``self.for_s``; ``PREEMPT_SHORTER``)."""
        if not PREEMPT_SHORTER or self.for_s == math.inf:
            return True
        hit = self._left.get(j.id)
        if hit is None:
            age = self.attained.get(j.id, 0.0) / max(1, j.spec.gpus)
            hit = self._left[j.id] = estimate_runtime(
                self.history, user=j.owner, workload=j.spec.workload,
                time_limit_s=j.spec.time_limit_s, age_s=age).left_s(age)
        return hit > self.for_s

    def _for(self, job: Job) -> None:
        """The waiting job's expected run time (inf: nothing known), for ``_outlasts``."""
        est = estimate_runtime(self.history, user=job.owner, workload=job.spec.workload,
                               time_limit_s=job.spec.time_limit_s) if PREEMPT_SHORTER else None
        self.for_s = math.inf if est is None or est.source == "default" else est.seconds

    def make(self, job: Job) -> str:
        """Preempt for ``job`` if that makes room; its wait reason then, else ''."""
        k = job.spec.gpus
        self._for(job)
        if k > self.node_max:
            return self._make_gang(job) if GANG_LAS else ""
        mine = self.rank(job)
        ok = _node_rule(job)
        by_node: dict[str, list[_Gpu]] = {}
        for g in self.rnd.gpus:
            if g.reserved or not ok(g):
                continue
            if all(self._movable(r.job_id, mine) for r in g.residents):
                by_node.setdefault(g.node, []).append(g)
        best: tuple[tuple[Any, ...], list[_Gpu], set[int]] | None = None
        for node, gs in by_node.items():
            if len(gs) < k:
                continue
            # cheapest GPUs first: empty ones, then those of the latest-ranked jobs
            gs.sort(key=lambda g: (len(g.residents), [-x for x in max(
                (self.ranks[r.job_id] for r in g.residents), default=())]))
            chosen = gs[:k]
            jobs = {r.job_id for g in chosen for r in g.residents}
            cost = (sum(self.by_id[j].spec.gpus for j in jobs), len(jobs), node)
            if best is None or cost < best[0]:
                best = (cost, chosen, jobs)
        if best is None or not best[2]:
            return ""
        _, chosen, jobs = best
        return self._take(chosen, jobs)

    def _make_gang(self, job: Job) -> str:
        """For a gang: whole nodes whose every job ranks after it (and may be preempted), the
        cheapest first (fewest GPUs of jobs to preempt, then the larger node), until they
        hold its GPUs; '' if there are not enough."""
        mine = self.rank(job)
        ok = _node_rule(job)
        by_node: dict[str, list[_Gpu]] = {}
        for g in self.rnd.gpus:
            by_node.setdefault(g.node, []).append(g)
        cands: list[tuple[tuple[Any, ...], list[_Gpu], set[int]]] = []
        for node, gs in by_node.items():
            if all(not g.reserved and ok(g) and all(self._movable(r.job_id, mine)
                                                    for r in g.residents) for g in gs):
                jobs = {r.job_id for g in gs for r in g.residents}
                cost = sum(self.by_id[j].spec.gpus for j in jobs)
                cands.append(((cost, -len(gs), node), gs, jobs))
        cands.sort(key=lambda c: c[0])
        left, chosen, victims = job.spec.gpus, [], set()
        for _, gs, jobs in cands:
            if left <= 0:
                break
            chosen += gs
            victims |= jobs
            left -= len(gs)
        if left > 0 or not victims:
            return ""
        return self._take(chosen, victims)

    def _take(self, chosen: list[_Gpu], jobs: set[int]) -> str:
        """Preempt ``jobs`` and hold ``chosen`` and every GPU they leave for the job."""
        # a victim on several GPUs frees them all: hold every GPU it leaves, for this job
        held = [g for g in self.rnd.gpus if not g.reserved and (
            g in chosen or any(r.job_id in jobs for r in g.residents))]
        self.rnd.reserve(held, self.now)   # need_at now: nobody backfills them
        self.victims.update(jobs)
        names = ", ".join(str(j) for j in sorted(jobs))
        many = len(jobs) > 1
        return (f"preempting job{'s' if many else ''} {names} (requeueable, ranked after it: "
                f"least attained service first); starts once "
                f"{'they have' if many else 'it has'} checkpointed")


NodeRule = Callable[["_Gpu"], bool]


class _ModelRound:
    """A round over more than one GPU model (``plan(..., speeds=...)``; scheduler/gpumodels.py
    says how a job's speed per model is known and which model it prefers). The job tries its
    models best first, each through the one-model rules (``_place_whole``/``_place_single``)
    restricted to that model's GPUs, so sharing, memory and reservations are unchanged; the
    first model where it can start wins. Its wait reason, or its placement's, names the model
    and factor when the model decided. Built once per round (the queue's mean factor per
    model); nothing here runs per pair."""

    def __init__(self, models: tuple[str, ...], speeds: ModelSpeeds,
                 means: Mapping[str, float]):
        self.models = models
        self.speeds = speeds
        self.means = means

    @classmethod
    def of(cls, slots: Sequence[GpuSlot], ordered: Sequence[Job],
           speeds: ModelSpeeds | None) -> _ModelRound | None:
        models = tuple(sorted({s.gpu_model for s in slots}))
        if len(models) < 2 or speeds is None or not all(m in speeds.models for m in models):
            return None   # one model, or blind to models: the one-model rules, unchanged
        return cls(models, speeds, queue_means(speeds, [j.spec.workload for j in ordered]))

    def note(self, workload: str | None, chosen: str, others: Sequence[str]) -> str:
        """'a100 runs resnet50 at 0.55x its h200 speed (measured on both a100 and h200)': the
        chosen model against the fastest other one."""
        if not others:
            return ""
        f = self.speeds.factor(workload, chosen)
        best = max(others, key=lambda m: self.speeds.factor(workload, m))
        g = self.speeds.factor(workload, best)
        what = workload or "this workload"
        side = chosen if chosen != self.speeds.reference else best
        return (f"{chosen} runs {what} at {f / g:.2f}x its {best} speed "
                f"({self.speeds.why(workload, side)})")

    def place(self, rnd: _Round, job: Job, res: _Res, need: float | None, predict: Predict,
              policy: Policy, behind: int, ok: NodeRule, whole: bool
              ) -> tuple[Placement | None, str]:
        workload = job.spec.workload
        # the models it may use: the round's for a job without a node rule (no pass over
        # every GPU for every job)
        present = list(self.models) if ok is _anywhere else sorted(
            {g.model for g in rnd.gpus if ok(g)})
        pressure = behind >= rnd.n_empty()
        order = preference(self.speeds, workload, present, pressure and not whole, self.means)
        first_why = ""
        for m in order:
            if whole:
                got, why = _place_whole(rnd, job, res, need, _on_model(m, ok))
            else:
                got, why = _place_single(rnd, job, res, need, predict, policy, behind, ok, m)
            if got is not None:
                note = self.note(workload, m, [o for o in present if o != m])
                return replace(got, note=note), ""
            if not first_why:
                extra = self.note(workload, m, [o for o in present if o != m])
                first_why = f"{why} (on {m}{'; ' + extra if extra else ''})"
        return None, first_why or "all GPUs are busy; waiting for a job to finish"


def _closed_note(rnd: _Round, ok: NodeRule) -> str:
    """'; GPU n1:0 takes no partners: ...' for the first closed GPU this job could otherwise
    join (room for one more job), '' if none."""
    for g in rnd.closed_gpus:
        if (ok(g) and not g.reserved and g.residents
                and len(g.residents) < g.max_jobs):
            return f"; {g.name} takes no new partners: {rnd.closed[g.name]}"
    return ""


def _anywhere(g: _Gpu) -> bool:
    return True


def _node_rule(job: Job) -> NodeRule:
    """Which GPUs the job may use: those of nodes its --constraint/--nodelist/--exclude allow
    (``_anywhere``, the same object, when it gives none)."""
    spec = job.spec
    if not (spec.constraint or spec.nodelist or spec.exclude):
        return _anywhere
    return lambda g: node_allowed(spec, g.node, g.labels)


def _resident(job: Job, profiles: Mapping[str, Profile], policy: Policy,
              durations: Durations | None = None, now: float = 0.0) -> _Res:
    prof = profiles.get(job.spec.workload) if job.spec.workload else None
    floor = job.spec.min_speed if job.spec.min_speed is not None else policy.min_speed
    solo = job.spec.exclusive or job.spec.gpus > 1
    if durations is None or prof is None or solo:
        return _Res(job.id, prof, floor, solo)
    age = now - job.started_at if job.started_at is not None else 0.0
    limit = job.spec.time_limit_s
    index = durations.index(job.spec.workload, limit, age)
    bucket = round(math.log(index) / INDEX_STEP) if index > 0 else -10**6
    left = durations.expected_left(job.spec.workload, limit, age) if job.started_at else 0.0
    return _Res(job.id, prof, floor, solo, index, bucket, age, left)


# plan()'s guesses at why nodes offer no GPUs, where it sees only that they offer none: the
# round, which knows the cause (a node drained, or skipped while its launches fail), says it
# instead (controller/round/steps/schedule.py)
UNOFFERED = "(down, or not in the inventory)"
NO_GPUS = "no GPUs available (no node answered, or the inventory lists none)"
# plan()'s reason for a job with no profile (it starts only on an empty GPU, to be profiled);
# the round adds why where new programs may not share (controller/round/steps/profile.py)
NO_PROFILE = "no profile yet: waits for an empty GPU to profile on"


def _full_reason(job: Job, total: int) -> str:
    if total == 0:
        return NO_GPUS
    if job.spec.gpus > 1:
        return f"needs {job.spec.gpus} free GPUs on one node; all {total} GPUs are busy"
    return f"all {total} GPUs are busy or reserved; waiting for a job to finish"


def _gib(mib: float | None) -> str:
    return gib(mib, unit=" GiB")


def _place_whole(rnd: _Round, job: Job, res: _Res, need: float | None,
                 ok: NodeRule = _anywhere) -> tuple[Placement | None, str]:
    """Jobs that must be alone: empty GPUs on one node, best fit (fewest empty GPUs)."""
    k = job.spec.gpus
    best: list[_Gpu] | None = None
    best_size = 0
    largest, largest_node = 0, ""
    for node, all_gpus in rnd.empty.items():
        gpus = all_gpus if ok is _anywhere else {i: g for i, g in all_gpus.items() if ok(g)}
        n = len(gpus)
        if n > largest:
            largest, largest_node = n, node
        if n < k or (best is not None and n >= best_size):
            continue   # too few empty GPUs, or no tighter fit than the best so far
        fit = [g for g in gpus.values() if g.fits(need)]
        if len(fit) >= k:
            best, best_size = fit[:k], n
    if best is None:
        # why not, for the reason: the first empty GPU (in the same order) too small for it
        mem_blocked = next((g for gpus in rnd.empty.values() for g in gpus.values()
                            if ok(g) and not g.fits(need)), None)
        if k > 1 and largest >= k and mem_blocked is not None:
            return None, (f"needs {k} GPUs with {_gib(need)} free on one node; "
                          f"{mem_blocked.name} has {_gib(mem_blocked.free)} free")
        if k > 1:
            where = f" (node {largest_node})" if largest else ""
            return None, f"needs {k} free GPUs on one node; largest is {largest}{where}"
        if mem_blocked is not None and largest:
            return None, (f"needs {_gib(need)} of GPU memory; {mem_blocked.name} has "
                          f"{_gib(mem_blocked.free)} free")
        if res.profile is None:
            return None, NO_PROFILE
        return None, "exclusive: waits for an empty GPU"
    for g in best:
        rnd.add(g, res, need)
    return Placement(job.id, best[0].node, tuple(g.index for g in best), {job.id: 1.0}), ""


def _place_gang(rnd: _Round, job: Job, res: _Res, need: float | None, ok: NodeRule,
                node_size: Mapping[str, int]) -> tuple[Placement | None, str]:
    """A job larger than any node (``plan(..., gangs=True)``): whole empty nodes, largest
    first (then by name), until they hold its GPUs; all of each node but the last, whose
    lowest GPUs make up the rest. Nothing shares with it; it never takes part of a busy node."""
    k = job.spec.gpus
    free = sorted((n for n, gpus in rnd.empty.items()
                   if len(gpus) == node_size[n] and all(ok(g) and g.fits(need)
                                                        for g in gpus.values())),
                  key=lambda n: (-node_size[n], n))
    taken: list[tuple[str, list[_Gpu]]] = []
    left = k
    for n in free:
        if left <= 0:
            break
        gpus = sorted(rnd.empty[n].values(), key=lambda g: g.index)[:left]
        taken.append((n, gpus))
        left -= len(gpus)
    if left > 0:
        size = max(node_size.values(), default=0)
        return None, (f"needs {k} GPUs on whole nodes (a gang of {math.ceil(k / size)} nodes "
                      f"of {size}); {len(free)} node{'s' if len(free) != 1 else ''} wholly "
                      "free")
    for _, gpus in taken:
        for g in gpus:
            rnd.add(g, res, need)
    (first, gpus0), rest = taken[0], taken[1:]
    return Placement(job.id, first, tuple(g.index for g in gpus0), {job.id: 1.0},
                     gang=tuple((n, tuple(g.index for g in gs)) for n, gs in rest)), ""


def _place_single(rnd: _Round, job: Job, res: _Res, need: float | None,
                  predict: Predict, policy: Policy, behind: int,
                  ok: NodeRule = _anywhere, model: str | None = None
                  ) -> tuple[Placement | None, str]:
    """A profiled one-GPU job: alone on an empty GPU, or joining the GPU where it pays most
    (``model``: only among that GPU model's; sharing finds them by its index's model key)."""
    here = ok if model is None else _on_model(model, ok)
    empty = _best_empty(rnd, need, here)
    pressure = behind >= rnd.n_empty()
    if empty is not None and not pressure:
        rnd.add(empty, res, need)
        return Placement(job.id, empty.node, (empty.index,), {job.id: 1.0}), ""
    share, why = best_share(rnd, res, need, predict, policy, ok, model, _anywhere)
    if share is not None:
        g, speeds = share
        rnd.add(g, res, need)
        return Placement(job.id, g.node, (g.index,), speeds), ""
    if empty is not None:
        rnd.add(empty, res, need)
        return Placement(job.id, empty.node, (empty.index,), {job.id: 1.0}), ""
    spare = next((g for gs in rnd.empty.values() for g in gs.values() if here(g)), None)
    if spare is not None:
        return None, (f"needs {_gib(need)} of GPU memory; {spare.name} has "
                      f"{_gib(spare.free)} free")
    return None, why or "all GPUs are busy; waiting for a job to finish"


def _on_model(model: str, ok: NodeRule) -> NodeRule:
    """``ok`` restricted to one GPU model's GPUs."""
    def rule(g: _Gpu) -> bool:
        return g.model == model and ok(g)
    return rule


def _best_empty(rnd: _Round, need: float | None, ok: NodeRule = _anywhere) -> _Gpu | None:
    """An empty GPU on the node with the fewest empty GPUs (whole nodes stay for big jobs)."""
    if not rnd.empty:
        return None
    if ok is _anywhere:   # the common case, without copying the index
        first = min(rnd.empty.items(), key=lambda kv: (len(kv[1]), kv[0]))
        g = next((g for g in first[1].values() if g.fits(need)), None)
        if g is not None:
            return g
    for _, gpus in sorted(rnd.empty.items(), key=lambda kv: (len(kv[1]), kv[0])):
        for g in gpus.values():
            if ok(g) and g.fits(need):
                return g
    return None


def _could_run(rnd: _Round, job: Job, profiles: Mapping[str, Profile], policy: Policy) -> bool:
    """Whether some GPU here could take ``job`` (its node rule, its memory): pressure counts
    only such jobs."""
    ok = _node_rule(job)
    if ok is not _anywhere and not any(ok(g) for g in rnd.gpus):
        return False
    return not _never_fits(rnd, job_memory_mib(job, profiles, policy), ok)


def _never_fits(rnd: _Round, need: float | None, ok: NodeRule = _anywhere) -> str:
    """A reason if no GPU here could ever hold ``need`` (e.g. --mem typed in MiB), else ''."""
    if need is None:
        return ""
    # every job without a node rule: the round's one figure
    largest = rnd.largest if ok is _anywhere else _largest([g for g in rnd.gpus if ok(g)])
    if largest is None or need <= largest:
        return ""
    return (f"needs {_gib(need)} of GPU memory per GPU; the largest GPU here has "
            f"{_gib(largest)} (check --mem, given in GiB)")


def _largest(gpus: Sequence[_Gpu]) -> float | None:
    """The largest GPU memory among ``gpus``; None if there are none or one's is unknown."""
    known = [g.total for g in gpus if g.total is not None]
    return max(known) if known and len(known) == len(gpus) else None


def _reservation(rnd: _Round, job: Job, need: float | None, left_s: float,
                 holder: int | None, ok: NodeRule = _anywhere,
                 ests: _Estimates | None = None,
                 node_size: Mapping[str, int] | None = None) -> tuple[str, int | None]:
    """For a blocked whole-GPU job: what its reason adds about reserving GPUs (so a user knows
    when it stops waiting behind small jobs), and the job holding this round's reservation.
    ``node_size`` (GPUs per node): the job is a gang, and holds whole nodes."""
    if left_s > 0:
        what = "whole nodes" if node_size else "GPUs" if job.spec.gpus > 1 else "a GPU"
        return f"; will reserve {what} in {_eta(left_s)}", holder
    if holder is not None:
        return f"; job {holder} reserves GPUs first", holder
    gpus = _reserve_gang(rnd, job, need, ok, ests, node_size) if node_size \
        else _reserve(rnd, job, need, ok, ests)
    if not gpus:
        return "", None
    nodes = sorted({g.node for g in gpus})
    where = (f"nodes {', '.join(nodes)}" if len(nodes) > 1
             else gpus_at(gpus[0].node, (g.index for g in gpus)))
    eta = ""
    if ests is not None and gpus[0].need_at > ests.now and not any(
            r.job_id in ests.guessed for g in gpus for r in g.residents):
        eta = f", expected free in {_eta(gpus[0].need_at - ests.now)}"
    return (f"; reserving {where} while {'they drain' if len(gpus) > 1 else 'it drains'}"
            f"{eta} (shorter jobs may use them until then)", job.id)


def _eta(seconds: float) -> str:
    """A wait rounded up to the minute: 42m, 3h05m."""
    m = math.ceil(seconds / 60)
    return f"{m}m" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def _reserve(rnd: _Round, job: Job, need: float | None, ok: NodeRule = _anywhere,
             ests: _Estimates | None = None) -> list[_Gpu]:
    """Hold GPUs for a blocked whole-GPU job so it cannot starve: among nodes whose GPUs could
    hold it at all (none if no node could), the one whose ``k`` first GPUs to empty are
    expected to empty first, by the expected remaining run time of their jobs (``ests``;
    without it, by how many jobs they hold). The held GPUs record when they are expected to
    be needed: until then shorter jobs may use them (backfill, in plan())."""
    k = job.spec.gpus
    by_node: dict[str, list[_Gpu]] = {}
    for g in rnd.gpus:
        if not g.reserved and ok(g) and g.could_ever_fit(need):
            by_node.setdefault(g.node, []).append(g)
    cands = [(n, gs) for n, gs in by_node.items() if len(gs) >= k]
    if not cands:
        return []

    def free_in(g: _Gpu) -> float:
        return ests.free_in(g) if ests is not None else float(len(g.residents))

    def first_k(gs: list[_Gpu]) -> list[_Gpu]:
        return sorted(gs, key=lambda g: (free_in(g), len(g.residents), g.index))[:k]

    def readiness(item: tuple[str, list[_Gpu]]) -> tuple[float, int, str]:
        # when its k GPUs are all free
        gs = first_k(item[1])
        return (max(free_in(g) for g in gs), sum(len(g.residents) for g in gs), item[0])
    _, gs = min(cands, key=readiness)
    held = sorted(first_k(gs), key=lambda g: g.index)
    need_at = ests.now + max(free_in(g) for g in held) if ests is not None else 0.0
    rnd.reserve(held, need_at)
    return held


def _reserve_gang(rnd: _Round, job: Job, need: float | None, ok: NodeRule,
                  ests: _Estimates | None, node_size: Mapping[str, int]) -> list[_Gpu]:
    """Hold whole nodes for a blocked gang (a job larger than any node) so it cannot starve
    behind smaller jobs: the nodes expected to empty first (a node empties when its last job
    ends, by expected remaining run time; without ``ests``, by how many jobs it holds), until
    they hold its GPUs; only nodes of which every GPU could take it and none is held already.
    Every GPU of those nodes is held (a gang takes only whole empty nodes), recording when the
    last of them is expected to empty: until then shorter jobs may use them (backfill)."""
    by_node: dict[str, list[_Gpu]] = {}
    for g in rnd.gpus:
        by_node.setdefault(g.node, []).append(g)
    cands = [(n, gs) for n, gs in by_node.items()
             if len(gs) == node_size[n] and all(
                 not g.reserved and ok(g) and g.could_ever_fit(need) for g in gs)]

    def free_in(g: _Gpu) -> float:
        return ests.free_in(g) if ests is not None else float(len(g.residents))

    def readiness(item: tuple[str, list[_Gpu]]) -> tuple[float, int, int, str]:
        n, gs = item
        return (max(free_in(g) for g in gs), sum(len(g.residents) for g in gs),
                -node_size[n], n)
    left = job.spec.gpus
    chosen: list[tuple[float, list[_Gpu]]] = []
    for _n, gs in sorted(cands, key=readiness):
        if left <= 0:
            break
        chosen.append((max(free_in(g) for g in gs), sorted(gs, key=lambda g: g.index)))
        left -= len(gs)
    if left > 0:
        return []   # not enough nodes it could ever run on (it waits with its reason)
    held = [g for _, gs in chosen for g in gs]
    need_at = ests.now + max(t for t, _ in chosen) if ests is not None else 0.0
    rnd.reserve(held, need_at)
    return held

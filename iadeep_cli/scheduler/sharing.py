"""When sharing a GPU pays, for ``placement.plan()``: pure, like it.

Two questions of a round:

- **Pressure**: how many GPUs the queued jobs behind this one could take *now*. Only jobs
  that could start count: a task beyond its array's ``%N``, a job over its owner's limit, one
  whose node rule names no GPU here or whose memory fits no GPU will not take an empty GPU,
  so it is no reason to pack the others (``Pressure``).
- **Value** of putting a job on an occupied GPU (``best_share``). With ``sharing:
  threshold`` the predicted speeds of the GPU's jobs must sum to ``share_threshold`` and more
  than without the newcomer (the group's throughput). With ``sharing: jct`` the decision is
  taken on what the mean job completion time (JCT) depends on, in seconds of JCT saved
  (``jct_value``): the newcomer skips its expected wait for a GPU (the jobs ahead of it still
  waiting, over the rate at which running jobs finish), but runs slower, and so do its
  partners, for as long as the group likely stays together (until its first job ends: one
  over the group's completion rate); and the jobs queued behind gain the extra work the GPU
  does, spread over the lab's GPUs. Each job's completion rate is its speed times its
  completion index (``scheduler.remaining``: from the lab's run times, its ``--time`` and how
  long it has run), so a job likely to end soon is left to finish alone, one that has run for
  hours is a good partner, and a job that would wait long accepts a slower share. Either way
  no job may fall below its floor (``--min-speed``, else ``min_speed``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from ..jobs import Job, parse_array
from ..settings import Policy, UserLimit
from ..text import gib
from .limits import Usage
from .prediction import Predict

# placement.py's round, GPU and resident types (not imported here: placement imports this)
_Round: TypeAlias = Any
_Gpu: TypeAlias = Any
_Res: TypeAlias = Any
# A group of three or more jobs is formed only when its completion rate beats the rate before
# by this fraction of the newcomer's alone-rate (groups of three are predicted by composing
# pairs; tuned leave-one-workload-out on seeds 10-19, benchmarks/eval_placement.py).
GROUP_MARGIN = 0.0
QUEUE_WEIGHT = 1.0


# --------------------------------------------------------------------------- pressure
class Pressure:
    """For each position in the round's queue order, how many GPUs the jobs after it could
    take now: a pass over the queue in queue order with each array's and each user's
    room (``--array %N``, ``users:`` limits) spent in queue order, and jobs no GPU here could
    ever hold left out. The pass is lazy: it goes only as far into the queue as the questions
    asked need (``at_least``: a few jobs past the one being placed; ``behind``: to the end),
    with the same answers as a whole pass, so a round that stops early costs no more than
    the jobs it looked at (the simulator's long queues: benchmarks/bench_sim_scale.py)."""

    def __init__(self, ordered: Sequence[Job], tasks_active: Mapping[int, int],
                 usage: Usage, limits: Mapping[str, UserLimit],
                 could_run: Callable[[Job], bool]):
        self._ordered = ordered
        self._tasks_active = tasks_active
        self._could_run = could_run
        self._room: dict[int, int | None] = {}          # array id -> tasks it may still start
        self._gpus_left: dict[str, float] = {}
        self._jobs_left: dict[str, float] = {}
        for user, lim in limits.items():
            held, n = usage.get(user, (frozenset(), 0))   # each GPU once, shared or not
            self._gpus_left[user] = math.inf if lim.max_gpus is None else lim.max_gpus - len(held)
            self._jobs_left[user] = math.inf if lim.max_jobs is None else lim.max_jobs - n
        self._want: list[int] = []
        self._prefix = [0]     # _prefix[k]: GPUs wanted by the first k jobs

    def _scan(self, upto: int) -> None:
        """Work out ``want`` for the jobs before position ``upto`` (in order, once each)."""
        ordered, room = self._ordered, self._room
        gpus_left, jobs_left = self._gpus_left, self._jobs_left
        for i in range(len(self._want), min(upto, len(ordered))):
            self._want.append(0)
            self._prefix.append(self._prefix[-1])
            job = ordered[i]
            k = job.spec.gpus
            if job.array_id is not None and job.spec.array is not None:
                if job.array_id not in room:
                    limit = _array_limit(job.spec.array)
                    room[job.array_id] = None if limit is None else \
                        limit - self._tasks_active.get(job.array_id, 0)
                left = room[job.array_id]
                if left is not None and left <= 0:
                    continue
            if job.owner in gpus_left and (gpus_left[job.owner] < k
                                           or jobs_left[job.owner] < 1):
                continue
            if not self._could_run(job):
                continue
            if job.array_id is not None and room.get(job.array_id) is not None:
                room[job.array_id] -= 1   # type: ignore[operator]
            if job.owner in gpus_left:
                gpus_left[job.owner] -= k
                jobs_left[job.owner] -= 1
            self._want[i] = k
            self._prefix[-1] += k

    def behind(self, i: int) -> int:
        """GPUs wanted by the startable jobs after queue position ``i``."""
        self._scan(len(self._ordered))
        return self._prefix[-1] - self._prefix[i + 1]

    def at_least(self, i: int, cap: int) -> int:
        """``min(behind(i), cap)``, looking only as far past ``i`` as it takes."""
        n = len(self._ordered)
        self._scan(i + 1)
        while True:
            have = self._prefix[-1] - self._prefix[i + 1]
            if have >= cap or len(self._want) >= n:
                return min(have, cap)
            self._scan(len(self._want) + max(1, cap - have))   # each startable job wants >= 1

    def wants(self, i: int) -> int:
        """GPUs the job at position ``i`` could take now (0: it cannot start this round)."""
        self._scan(i + 1)
        return self._want[i]


def completion_rate(gpus: Sequence[_Gpu], predict: Predict) -> float:
    """Jobs finishing per second on these GPUs, expected: each running job's predicted speed
    times its completion index (``scheduler.remaining``)."""
    rate = 0.0
    for g in gpus:
        rs = g.residents
        if not rs:
            continue
        speeds = predict([r.profile for r in rs]) if len(rs) > 1 and all(
            r.profile is not None for r in rs) else (1.0,) * len(rs)
        rate += sum(s * r.index for r, s in zip(rs, speeds))
    return rate


def _array_limit(text: str) -> int | None:
    try:
        return parse_array(text).limit
    except Exception:   # validated at submission; an unreadable one limits nothing here
        return None


# --------------------------------------------------------------------------- value
def best_share(rnd: _Round, res: _Res, need: float | None, predict: Predict,
               policy: Policy, ok: Callable[[_Gpu], bool], model: str | None,
               anywhere: Callable[[_Gpu], bool]
               ) -> tuple[tuple[_Gpu, dict[int, float]] | None, str]:
    """The occupied GPU where this job pays most, within the rules (``model``: only that GPU
    model's GPUs), or None and why not. GPUs whose residents have the same signature (labels,
    floors and, with ``sharing: jct``, completion-index bucket) are judged once."""
    jct = policy.sharing == "jct"
    # what joining a class of GPUs predicts depends only on the class and the newcomer's key:
    # worked out once a round (a round asks it for every queued job of the same workload)
    memo = rnd.__dict__.setdefault("_judged", {})
    best: tuple[float, _Gpu, dict[int, float]] | None = None
    why = ""
    rank = 0   # how informative `why` is: memory < value < floor
    for cls, all_gpus in rnd.shareable.items():
        gpu_model = cls[0]
        if model is not None and gpu_model != model:
            continue
        gpus = all_gpus if ok is anywhere else {k: g for k, g in all_gpus.items() if ok(g)}
        if not gpus:
            continue
        sample = next(iter(gpus.values()))
        order, speeds, old, low_at = _judged(memo, cls, sample.residents, res, predict)
        if low_at is not None:
            r, s = [*sample.residents, res][order[low_at]], speeds[low_at]
            who = "it" if r is res else f"job {r.job_id}"
            why, rank = (f"would slow {who} to {s:.2f} on {sample.name} (floor {r.floor:g})", 3)
            continue
        if jct:
            items = [*sample.residents, res]
            group = [items[p] for p in order]
            value, overlap = jct_value(rnd, res, group, speeds, sample.residents, old)
            if value <= 0:
                if rank < 2:
                    why, rank = (_not_worth(rnd, sample, res, group, speeds, old, overlap), 2)
                continue
            score = value
        else:
            combined = sum(speeds)
            score = combined - sum(old)
            if combined < policy.share_threshold or score <= 0:
                if rank < 2:
                    why, rank = (f"sharing {sample.name} would give combined speed "
                                 f"{combined:.2f} (needs {policy.share_threshold:g}); waits "
                                 "for a better match", 2)
                continue
        if best is not None and score <= best[0]:
            continue
        g = next((g for g in gpus.values() if g.fits(need)), None)
        if g is None:
            if rank < 1:
                why, rank = (f"needs {gib(need, unit=' GiB')} of GPU memory; {sample.name} "
                             f"has {gib(sample.free, unit=' GiB')} free", 1)
            continue
        joined = [*g.residents, res]   # g's residents have the sample's keys: same order
        ids = {joined[p].job_id: s for p, s in zip(order, speeds)}
        best = (score, g, ids)
    if best is None:
        return None, why
    return (best[1], best[2]), ""


def _judged(memo: dict[Any, Any], cls: tuple[Any, ...], residents: Sequence[_Res], res: _Res,
            predict: Predict
            ) -> tuple[list[int], Sequence[float], Sequence[float], int | None]:
    """For a class of GPUs (``cls``: its model and residents' signature) and a newcomer: the
    order of [*residents, newcomer] by key, the group's predicted speeds in that order, the
    residents' speeds now, and the first one in that order its floor rules out (or None)."""
    key = (cls, res.key)
    hit = memo.get(key)
    if hit is None:
        items = [*residents, res]
        order = sorted(range(len(items)), key=lambda i: items[i].key)
        group = [items[p] for p in order]
        speeds = predict([r.profile for r in group])
        old = predict([r.profile for r in residents]) if len(residents) > 1 else (1.0,)
        low_at = next((i for i, (r, s) in enumerate(zip(group, speeds)) if s < r.floor),
                      None)
        hit = memo[key] = (order, speeds, old, low_at)
    return hit


def jct_value(rnd: _Round, res: _Res, group: Sequence[_Res], speeds: Sequence[float],
              residents: Sequence[_Res], old: Sequence[float]) -> tuple[float, float]:
    """Seconds of job completion time saved, summed over jobs, by ``res`` joining now (>0: it
    pays), and the expected time the group stays together (until its first job ends: one over
    its completion rate). The newcomer gains the wait it skips (``rnd.wait_s``) less its own
    slowdown over that time; each partner loses its slowdown; and the queue behind gains (or
    loses) the work the GPU does beyond what it did, spread over the lab's GPUs."""
    rate = sum(s * r.index for r, s in zip(group, speeds))
    overlap = 1.0 / rate if rate > 0 else math.inf
    if not math.isfinite(overlap):
        return -math.inf, overlap
    before = dict(zip((r.job_id for r in residents), old))
    mine = next(s for r, s in zip(group, speeds) if r is res)
    lost = (1.0 - mine) * overlap
    for r, s in zip(group, speeds):
        if r is not res:
            b = before[r.job_id]
            lost += max(0.0, b - s) / b * overlap if b > 0 else 0.0
    queue = QUEUE_WEIGHT * rnd.behind * (sum(speeds) - sum(old)) * overlap / max(1, len(rnd.gpus))
    margin = GROUP_MARGIN * overlap if len(group) > 2 else 0.0
    return rnd.wait_s - lost + queue - margin, overlap


def _not_worth(rnd: _Round, sample: _Gpu, res: _Res, group: Sequence[_Res],
               speeds: Sequence[float], old: Sequence[float], overlap: float) -> str:
    """Why joining ``sample`` does not pay, in words: the wait it would skip against the
    slowdown, its own and its partners', for as long as they would likely share."""
    mine = next(s for r, s in zip(group, speeds) if r is res)
    before = dict(zip((r.job_id for r in sample.residents), old))
    slowed = ", ".join(f"job {r.job_id} (running {_hours(r.age)}) from {before[r.job_id]:.2f} "
                       f"to {s:.2f}" for r, s in zip(group, speeds) if r is not res)
    return (f"sharing {sample.name} would run it at {mine:.2f} and slow {slowed} for about "
            f"{_hours(overlap)} (until one of them likely ends), more than the "
            f"{_hours(rnd.wait_s)} it is expected to wait for a GPU; waits for a better match")


def _hours(seconds: float) -> str:
    m = max(0, round(seconds / 60))
    return f"{m}m" if m < 60 else f"{m // 60}h{m % 60:02d}m"

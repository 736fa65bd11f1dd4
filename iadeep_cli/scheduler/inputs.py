"""What ``placement.plan()`` decides by, beside the round's state, as one value.

``plan(queue, slots, active, now, inputs)``: the queue, the GPUs, the running jobs and the
time are the state a round (or one step of a forecast) sees; ``PlanInputs`` is the rest, the
lab's knowledge and settings, which a caller builds once and hands to every plan() call that
should decide alike: the controller's round (its placement, the opportunistic jobs' trial and
the forecast), the simulator's planners, the forecast's steps. Pure data, like plan().
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..profiles import Profile
from ..settings import Policy, UserLimit
from .gpumodels import ModelSpeeds
from .prediction import Predictor
from .remaining import Durations
from .reservations import Reservation


@dataclass(frozen=True)
class PlanInputs:
    """Everything plan() decides by except the queue, the GPUs, the running jobs and the time.

    ``profiles``: each workload's learnt profile. ``model``: any ``Predictor``; wrap it in
    ``CachedModel`` to keep its answers across calls. ``policy``: the lab's placement
    settings. ``user_limits``: each user's limits (``scheduler.limits``).
    ``fairshare``: priority points per user (``scheduler.fairshare``), worked out by the caller
    from what ran, so plan() stays a function of its arguments; None: fair share off.
    ``closed``: GPU name ("node:index") -> why it takes no new partners (run-time adaptation
    found its jobs running worse than predicted); a job that waits while one of these would
    otherwise have room for it says so.
    ``speeds``: each workload's solo speed per GPU model (``scheduler.gpumodels``), built by the
    caller once per round; used only when the slots hold more than one GPU model (None there:
    every model counts as equally fast, the 'blind' reading). One model: ignored, so a
    one-model lab's rounds are exactly what they were.
    ``durations``: the lab's run times (``scheduler.remaining``) that ``sharing: jct`` judges
    a group by; None: a broad prior alone (how long each job has run still counts).
    ``durations`` also gives the run-time estimates (``remaining.estimate_runtime``) that
    backfill on held GPUs and the choice of the node to hold go by (with or without
    ``sharing: jct``).
    ``reservations``: GPUs kept for one user over a window (``scheduler.reservations``).
    ``attained``: GPU-seconds each job has had over all its attempts (the caller's record);
    with ``Policy.preemption`` "las" the queue goes by its level first and ``Plan.preempt``
    names requeueable jobs to checkpoint for jobs that had less (docs/scheduling.md).
    ``gangs``: a job needing more GPUs than any node has runs on several whole empty nodes
    (``Placement.gang``); the simulator's replay of real traces sets it. Off, such a job
    waits with its reason (the controller launches a job on one node).
    ``reasons``: False (the simulator) stops the round once no GPU has room for anyone, so
    the jobs after that point get no wait reason; the placements are the same.
    """

    profiles: Mapping[str, Profile]
    model: Predictor
    policy: Policy
    user_limits: Mapping[str, UserLimit] = field(default_factory=dict)
    fairshare: Mapping[str, float] | None = None
    closed: Mapping[str, str] | None = None
    speeds: ModelSpeeds | None = None
    durations: Durations | None = None
    reservations: Sequence[Reservation] = ()
    attained: Mapping[int, float] | None = None
    gangs: bool = False
    reasons: bool = True

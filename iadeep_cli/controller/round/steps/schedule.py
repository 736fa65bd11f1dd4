"""Step: schedule: place the queued jobs (the pure ``plan()``) and start the placements."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ....errors import InvalidTransition
from ....jobs import ACTIVE, Job, JobState, dependencies
from ....model.data import shipped_profiles
from ....profiles import Profile
from ....scheduler import hostres
from ....scheduler.gpumodels import ModelSpeeds, model_speeds
from ....scheduler.inputs import PlanInputs
from ....scheduler.remaining import Durations
from ....settings import Inventory
from ....snapshot import ClusterSnapshot
from ....store import cluster, jobrows, profiles as profrows
from ....text import clock
from ... import reservations, runtimes  # `iadeep reserve`; run times
from ...fairshare import FairShareRound
from ...foresight import Foresight
from ..context import Context, Round, Step
from .adaptation import Adapter
from .backoff import Backoff
from .launch import Launches

if TYPE_CHECKING:
    from ....scheduler.placement import Plan

# a waiting job's reason when plan() preempts for it (scheduler/placement._preempt_las)
PREEMPTING = re.compile(r"preempting jobs? ([0-9]+(?:, [0-9]+)*) ")
# placement's run-time history (scheduler/remaining.py, controller/runtimes.py): the last 30
# days' finished jobs per label and per user, re-read at most every 10 minutes
RUN_TIMES_WINDOW_S = runtimes.WINDOW_S
LAG_ROUNDS = 4
RUN_TIMES_REFRESH_S = runtimes.REFRESH_S


class Schedule(Step):
    def __init__(self, ctx: Context, adapt: Adapter, launches: Launches, launch_health: Backoff,
                 fairshare: FairShareRound, model: Callable[[], Any],
                 tuned: Callable[[Inventory], Inventory] = lambda inventory: inventory,
                 foresight: Foresight | None = None,
                 work_left: Callable[[], dict[int, float]] = dict):
        super().__init__(ctx)
        self.adapt = adapt   # steps/adaptation.Adapter: closed GPUs, --opportunistic room
        self.launches = launches
        self._launch_health = launch_health
        self.fairshare = fairshare   # lab.policy.fairshare: usage -> priority points
        self._model = model   # the interference model in use (SchedulingLoop.model)
        self._tuned = tuned   # the lab with its self-tuned plan() settings (steps/tune.py)
        self._durations: tuple[float, Durations] | None = None   # (read at, run times)
        self.foresight = foresight   # the forecast thread (controller/foresight.py); None: none
        # running jobs' solo work left (seconds) from their reported progress
        # (observer.SpeedObserver.work_left), read at each round for the forecast
        self._work_left = work_left
        self.progress_left: dict[int, float] = {}
        self._last_round: float | None = None
        self.round_s = 0.0   # the rounds' period, smoothed

    def run(self, r: Round) -> None:
        self.progress_left = self._work_left()   # for the forecast
        self.place(r.snapshot, r.profiles, r.provisional, r.cold_start)

    def place(self, snapshot: ClusterSnapshot, profiles: dict[str, Profile],
              provisional: dict[str, Profile] | None = None, cold_start: str = "") -> None:
        """Place the queued jobs whose dependencies are met (``plan()``), and start each
        placement; record why each other queued job waits. ``provisional``: profiles plan()
        places the labels with none yet by (steps/profile.py, ``cold_start: share``);
        ``cold_start``: what a job with no profile does, said in its waiting reason."""
        from ....scheduler.placement import GpuSlot, plan, slots_from_snapshot
        from ....scheduler.prediction import CautiousModel

        measured = profiles
        profiles = {**(provisional or {}), **profiles}

        began = self.clock()   # the rounds' period: how soon the forecast's starts can follow
        if self._last_round is not None:
            period = max(0.0, began - self._last_round)
            # smoothed, but a slower round counts at once (the forecast's lag is the slow case)
            self.round_s = max(period, 0.8 * self.round_s + 0.2 * period)
        self._last_round = began
        queue, later = self._begun(self.jobs({JobState.QUEUED}))
        queue, waits = self._dependencies_met(queue)
        waits.update(later)
        if not queue:
            with self.store.tx() as conn:
                jobrows.set_reasons(conn, list(waits.items()))
            if self.foresight is not None:   # the running jobs' expected ends
                now, active = self.clock(), self.jobs(ACTIVE)
                inventory = self._tuned(self.inventory)
                self._offer([], slots_from_snapshot(snapshot, active, inventory, profiles),
                            active, now, inventory,
                            PlanInputs(profiles, CautiousModel(self._model()),
                                       inventory.policy, self.inventory.user_limits,
                                       fairshare={}, durations=self._run_times(now)))
            return
        active = self.jobs(ACTIVE)
        with self.store.tx() as conn:   # `iadeep nodes drain` (read each round)
            drained = cluster.drain_waits(conn)
        snapshot = self._without_failing_nodes(self._without_drained(snapshot, drained))
        now = self.clock()
        fair = self.fairshare.points(self.store, self.inventory.policy, now)
        inventory = self._tuned(self.inventory)   # with self-tuned settings, if any
        closed = self.adapt.closed(now)
        speeds: dict[tuple[str, ...], ModelSpeeds | None] = {}   # per set of GPU models

        def decide(jobs: list[Job], slots: Sequence[GpuSlot], residents: list[Job]) -> Plan:
            """plan() as this round asks it, also for the opportunistic jobs' trial: the same
            cautious reading of the predictor as `iadeep sim`'s iadeep policy, the same
            fair-share points, the same GPUs closed to partners and the same speeds per GPU
            model (read once a round)."""
            models = tuple(dict.fromkeys(s.gpu_model for s in slots))
            if models not in speeds:
                speeds[models] = self._model_speeds(models)
            return plan(jobs, slots, residents, now,
                        dataclasses.replace(inputs, speeds=speeds[models]))

        reserved = reservations.load(self.store, now)   # `iadeep reserve` (read each round)
        durations = self._run_times(now)
        attained: dict[int, float] | None = None   # preemption: GPU time each job has had
        if inventory.policy.preemption != "off":
            with self.store.tx() as conn:
                attained = jobrows.attained(conn, [j.id for j in (*queue, *active)], now)
        # what this round's plan() calls decide by (the forecast's too, less preemption)
        inputs = PlanInputs(profiles, CautiousModel(self._model()), inventory.policy,
                            self.inventory.user_limits, fairshare=fair, closed=closed,
                            durations=durations, reservations=reserved, attained=attained)

        if self.adapt.make_room(queue, active, snapshot, profiles, decide):   # opportunists
            active = self.jobs(ACTIVE)                                          # yielded
        slots = slots_from_snapshot(snapshot, active, inventory, profiles)
        # host RAM and CPUs (--mem, --cpus-per-task) on the nodes that count them
        room = hostres.rooms(self.inventory.nodes, active)
        planned, host_waits = hostres.restrict(queue, room)
        decided = decide(planned, slots, self.adapt.residents(active))
        if self.foresight is not None:   # the forecast, in its own thread (foresight.py)
            self._offer(queue, slots, self.adapt.residents(active), now, inventory,
                        dataclasses.replace(inputs, attained=None, speeds=speeds.get(
                            tuple(dict.fromkeys(s.gpu_model for s in slots)))))
        waits.update(self._with_skipped_nodes(_with_drained(
            _with_cold_start(decided.waits, queue, measured, provisional or {}, cold_start),
            drained)))
        waits.update({i: why for i, why in host_waits.items() if i in waits})
        if decided.preempt and inventory.policy.preemption != "off":
            self._preempt(decided, [j for j in queue if j.id in decided.waits], active, now)
        by_id = {j.id: j for j in queue}
        for placement in decided.placements:
            job = by_id[placement.job_id]
            if placement.node in job.orphans:
                waits[job.id] = f"waits for node {placement.node} to stop its lost attempt"
                continue
            node_room = room.get(placement.node)
            if node_room is not None:
                if hostres.asks(job.spec) and not node_room.fits(job.spec):
                    # an earlier start this round took the room it needs there
                    waits[job.id] = hostres.waiting_reason(job.spec,
                                                           {placement.node: node_room})
                    continue
                node_room.take(job.spec)
            try:
                self.launches.start(job, placement)
            except InvalidTransition:   # held or cancelled since the plan was made
                waits.pop(job.id, None)
        with self.store.tx() as conn:
            jobrows.set_reasons(conn, list(waits.items()))

    def _offer(self, queue: list[Job], slots: Sequence[Any], active: list[Job], now: float,
               inventory: Inventory, inputs: PlanInputs) -> None:
        """Hand the forecast thread what this round saw, its plan() bound the same way
        (``inputs``: the round's, without ``attained``: the forecast places, it does not
        checkpoint)."""
        from ....scheduler import forecast as fc
        from ....scheduler.placement import spec_memory_mib
        from ....scheduler.prediction import CachedModel
        from ....scheduler.priority import order_queue
        from ...foresight import Inputs

        assert self.foresight is not None and inputs.durations is not None
        policy, profiles = inventory.policy, inputs.profiles
        fair, durations = inputs.fairshare, inputs.durations
        model = CachedModel(inputs.model)
        bound = dataclasses.replace(inputs, model=model)
        decide = fc.planner(bound)
        key = (tuple(j.id for j in queue),
               tuple((j.id, j.node, j.gpu_indices) for j in active),
               # work left by progress, to the minute (a new forecast when that moves)
               tuple(sorted((i, int(v // 60)) for i, v in self.progress_left.items())))
        self.foresight.offer(Inputs(
            tuple(queue), tuple(slots), tuple(active), now, decide,
            fc.lefts_of(durations, now, dict(self.progress_left)), fc.runtimes_of(durations),
            fc.speeds_of(profiles, model),
            lambda job: spec_memory_mib(job.spec, profiles, policy),
            lambda jobs, t: order_queue(jobs, policy, t, fair), key,
            # from a job's end to the next one running on its GPU: the round that notices the
            # end, the round that places, the launch (LAG_ROUNDS of them, slowest seen)
            LAG_ROUNDS * max(inventory.poll_interval_s, self.round_s),
            # `queue add --test-only`'s plan() gives its waiting reason
            fc.planner(bound, reasons=True)))

    def _preempt(self, decided: Plan, waiting: list[Job], active: list[Job], now: float) -> None:
        """Act on plan()'s preemptions: each running --requeue job it names gets its checkpoint
        signal once (the adapter commits the mark first, so never twice, even across a
        restart) and is requeued when it exits or its grace ends. It is preempted "for" the
        waiting job whose reason names it ("preempting job 4 ..."), else the first job plan()
        left waiting (plan() ranks the queue, and its waits keep that order)."""
        ranked = [i for i in decided.waits if any(j.id == i for j in waiting)]
        making_room: dict[int, int] = {}   # victim -> the waiting job its GPUs are for
        for waiter in ranked:
            found = PREEMPTING.match(decided.waits[waiter])
            for victim in (found.group(1).split(", ") if found else ()):
                making_room.setdefault(int(victim), waiter)
        by_id = {j.id: j for j in active}
        for job_id in decided.preempt:
            job = by_id.get(job_id)
            for_job = making_room.get(job_id, ranked[0] if ranked else None)
            if job is not None and job.checkpoint_at is None:
                self.adapt.preempt(job, f"job {for_job}" if for_job is not None
                                   else "a waiting job", now)

    def _run_times(self, now: float) -> Durations:
        """The lab's recent run times per workload label and per user, for placement (re-read every
        ``RUN_TIMES_REFRESH_S``)."""
        if self._durations is None or now - self._durations[0] >= RUN_TIMES_REFRESH_S:
            with self.store.tx() as conn:
                self._durations = (now, runtimes.history(conn, now))
        return self._durations[1]

    def _model_speeds(self, models: tuple[str, ...]) -> ModelSpeeds | None:
        """Each workload's solo speed per GPU model (scheduler/gpumodels.py), from every
        profile known, shipped and the lab's of every model, when the round's GPUs are of more
        than one model (``models``, in slot order); None otherwise (plan() then decides as on
        one model)."""
        if len(models) < 2:
            return None
        with self.store.tx() as conn:
            lab = [p for p, _source, _at in profrows.load_profiles(conn)]
        return model_speeds([*shipped_profiles().values(), *lab], models)

    def _begun(self, queue: list[Job]) -> tuple[list[Job], dict[int, str]]:
        """The queued jobs whose --begin time has come (sbatch's --begin), and why each other
        one waits (until when): those are not even considered for a GPU."""
        now = self.clock()
        later = {j.id: f"waiting until {clock(j.spec.begin_at)} (--begin)" for j in queue
                 if j.spec.begin_at is not None and j.spec.begin_at > now}
        return ([j for j in queue if j.id not in later] if later else queue), later

    def _dependencies_met(self, queue: list[Job]) -> tuple[list[Job], dict[int, str]]:
        """The queued jobs whose dependencies are met (only these go to ``plan()``), and why
        each other one waits. A job whose dependencies can never be met is cancelled, saying
        which one (``scheduler.depends``). Queued jobs come oldest first and a job can only
        depend on older ones, so a chain whose head failed is cancelled in one round."""
        from ....scheduler import depends

        needed = {dep for job in queue for _, dep in dependencies(job.spec)}
        if not needed:
            return queue, {}
        with self.store.tx() as conn:
            states = jobrows.states(conn, needed)
        ready, waits = [], {}
        for job in queue:
            waiting, never = depends.check(job.spec, states)
            if never is not None:
                try:
                    self.move(job, JobState.CANCELLED, never, ended_at=self.clock())
                except InvalidTransition:   # held or cancelled by its owner meanwhile
                    continue
                if job.id in states:
                    states[job.id] = JobState.CANCELLED
            elif waiting is not None:
                waits[job.id] = waiting
            else:
                ready.append(job)
        return ready, waits

    def _without_failing_nodes(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """Nodes whose launches keep failing (full disk, broken workdir) offer no GPUs until
        their back-off ends, so jobs go to the other nodes instead of looping on one."""
        now = self.clock()
        failing = {n: h for n, h in self._launch_health.items() if h.until > now}
        if not failing:
            return snapshot
        return dataclasses.replace(snapshot, nodes=tuple(
            dataclasses.replace(n, closed=f"launches failing: {failing[n.name].reason}")
            if n.name in failing else n for n in snapshot.nodes))

    @staticmethod
    def _without_drained(snapshot: ClusterSnapshot, drained: dict[str, str]) -> ClusterSnapshot:
        """Drained nodes offer no GPUs to new jobs; their running jobs stay where they are."""
        if not drained:
            return snapshot
        return dataclasses.replace(snapshot, nodes=tuple(
            dataclasses.replace(n, closed=drained[n.name]) if n.name in drained and
            n.closed is None else n for n in snapshot.nodes))

    def _with_skipped_nodes(self, waits: dict[int, str]) -> dict[int, str]:
        """Waiting reasons that name the nodes skipped because their launches fail (sudo
        refusing, a broken workdir), why, and when they are tried again: plan() saw those nodes
        only as offering no GPUs, which reads like nodes that are down."""
        now = self.clock()
        skipped = "; ".join(
            f"node {n} is skipped until {clock(h.until)} (in {h.until - now:.0f} s): its last "
            f"launch failed: {h.reason}" for n, h in sorted(self._launch_health.items())
            if h.until > now)
        if not skipped:
            return waits
        return {i: _cause_first(why, skipped) for i, why in waits.items()}


def _with_cold_start(waits: dict[int, str], queue: Sequence[Job],
                     measured: dict[str, Profile], provisional: dict[str, Profile],
                     cold_start: str) -> dict[int, str]:
    """Waiting reasons that say what a job with no profile yet does: starts beside others
    under a provisional profile, or waits for an empty GPU to profile on, and why
    (``cold_start``, steps/profile.Profiler.provisional)."""
    from ....scheduler.placement import NO_PROFILE

    if not cold_start:
        return waits
    out = dict(waits)
    for job in queue:
        why = waits.get(job.id)
        label = job.spec.workload
        if why is None or not label or label in measured:
            continue
        if label in provisional:
            out[job.id] = f"{cold_start}; {why}"
        elif why.startswith(NO_PROFILE) and cold_start.startswith(NO_PROFILE):
            out[job.id] = cold_start + why[len(NO_PROFILE):]
    return out


def _with_drained(waits: dict[int, str], drained: dict[str, str]) -> dict[int, str]:
    """Waiting reasons that say which nodes are drained (plan() saw them only as offering no
    GPUs), so nobody takes them for down."""
    if not drained:
        return waits
    said = "; ".join(f"node {n} is {why}" for n, why in sorted(drained.items()))
    return {i: _cause_first(why, said) for i, why in waits.items()}


def _cause_first(why: str, cause: str) -> str:
    """``why`` (plan()'s waiting reason) with ``cause`` (nodes drained or skipped, which the
    round knows and plan() does not): the cause alone where plan() saw no GPUs at all, the
    cause first and without plan()'s guess where it saw the job's nodes offer none ("down, or
    not in the inventory"), else after plan()'s own reason."""
    from ....scheduler.placement import NO_GPUS, UNOFFERED
    if why == NO_GPUS:
        return cause
    if why.endswith(f" {UNOFFERED}"):
        return f"{cause}; {why[:-len(UNOFFERED) - 1]}"
    return f"{why}; {cause}"

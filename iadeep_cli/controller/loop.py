"""One scheduling round, as a list of named steps (``SchedulingLoop.tick``).

    poll       steps/poll.py       every node's GPUs and its jobs' states, one round trip a node
    reconcile  steps/reconcile.py  each job on a node that answered, in line with its poll
    (clean)    steps/clean.py      ...and that node's abandoned attempts stopped, set aside
    lose       steps/lose.py       jobs of nodes silent past their grace: lost (and fencing)
    limits     steps/limits.py     jobs past their --time asked to stop (--signal first)
    idle       idle.py             running jobs whose GPUs sit idle: marked, owner told, acted on
    cancels    steps/cancels.py    stops sent for the jobs whose cancel was asked for
    profile    steps/profile.py    new workloads sampled alone on their GPU, then profiled
    observe    steps/observe.py    running jobs' speeds and co-location pairs recorded (refit)
    adapt      adaptation.py       a shared GPU gone wrong: closed, a job suspended; phases
    tune       tune.py             self-tuning: a what-if replay due (a child), or its answer
    schedule   steps/schedule.py   the queue placed (the pure ``plan()``), placements launched
    clean      steps/clean.py      finished jobs' old directories removed on their nodes

Each step is a small class over the controller's shared parts (``steps/context.Context``: the
store, the inventory and its node pool, the per-node workers, the clock), given what else it
needs when the loop builds it; the ends of an attempt (``steps/ends.py``) and a launch
(``steps/launch.py``) are shared by the steps that need them.

Why this order: the truth on the nodes (reconcile) is established before anything is decided,
so a restarted controller never starts a job that is already running. A launch is recorded as
``starting`` (with node and GPUs) and committed *before* the job is started on the node; if the
controller dies in between, the next round's reconcile finds either the job's pid file (it did
start: running) or nothing (it did not: queued again). A job is therefore never started twice.

Nodes never wait for each other. Every poll reads a node's GPUs *and* the state of its jobs in
one round trip; the round waits for the nodes only briefly (``round_wait_s``) and a slow node's
answer is used when it comes. What the loop does on a node (launch, cancel, stop an abandoned
attempt) runs on that node's own worker thread (``actions.NodeActions``), so a hung node holds
up only its own work. A job with an action in flight is left alone by reconcile until it is
done.

The rule that keeps a job from running twice: a job's next attempt starts only once its previous
attempt is known to have ended: its node answered and the attempt is gone, or an admin fenced
the node (``iadeep nodes fence``: "it is powered off, its jobs are dead"). A node whose
nvidia-smi fails still answers over SSH, so its jobs are still tracked; only a node that does
not answer at all for ``node_grace`` loses its jobs, and lost jobs wait for one of the two.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..inventory import Inventory
from ..jobs import Job
from ..nodes.connection import Pool
from ..store import Store
from . import foreign, idle
from .actions import NodeActions
from .fairshare import FairShareRound
from .foresight import Foresight
from .steps.backoff import Backoff
from .steps.cancels import Cancels
from .steps.clean import Clean
from .steps.context import Context, OnContext
from .steps.ends import Ends
from .steps.launch import Launches
from .steps.limits import Limits
from .steps.lose import Lose
from .steps.observe import Observe
from .steps.poll import Poll
from .steps.profile import Profiler
from .steps.reconcile import Reconcile
from .steps.schedule import Schedule
from .tune import SelfTuning

__all__ = ["NodeActions", "SchedulingLoop"]
log = logging.getLogger("iadeep.controller")
REFIT_TIMEOUT_S = 1800.0    # a refit child still running after this is killed (and logged)


class SchedulingLoop(OnContext):
    """The controller's scheduling round (``tick``), the steps it runs and the model they share.

    Public to the rest of the controller (runtime, the adapter, the service): ``tick``,
    ``close``, ``use``, ``fence``, ``launch_health``, ``script_copy``, ``refit`` and the
    shared parts (``store``, ``inventory``, ``pool``, ``actions``, ``clock``, ``model``,
    ``observer``), with ``jobs``, ``move`` and ``requeue`` for the adapter
    (``controller/adaptation.Host``)."""

    def __init__(self, store: Store, inventory: Inventory, pool: Pool, scripts_dir: Path,
                 clock: Callable[[], float] = time.time, fit_in_background: bool = True):
        from ..model.predictor import analytic_model
        from .adaptation import Adapter
        from .observe import SpeedObserver

        self.ctx = ctx = Context(store, inventory, pool, NodeActions(), clock)
        self.scripts_dir = scripts_dir
        self.model = analytic_model()   # conservative until the fitted model is ready
        self.observer = SpeedObserver(pool)
        self._fit_in_background = fit_in_background
        self._fit_lock = threading.Lock()
        self._fit_running = self._fit_again = False
        launch_health: Backoff = {}   # nodes whose launches fail, skipped a while
        self.fairshare = FairShareRound()   # lab.policy.fairshare: usage -> priority points
        self.adapt = Adapter(self)   # run-time adaptation (controller/adaptation.py)
        # the round's steps, in the order tick() runs them (see the module docstring)
        self.poll = Poll(ctx, self.observer)
        self.profiler = Profiler(ctx, self.observer)
        self.ends = Ends(ctx, self.adapt, launch_health, self.profiler.forget,
                         lambda pairs: self.speeds.learnt(pairs))
        self.reconcile = Reconcile(ctx, self.ends)
        self.lose = Lose(ctx, self.ends)
        self.limits = Limits(ctx)
        self.idle = idle.IdleWatch()   # running jobs whose GPUs sit idle (controller/idle.py)
        self.foreign = foreign.ForeignWatch()   # foreign processes holding a GPU idle (foreign.py)
        self.cancels = Cancels(ctx)
        self.speeds = Observe(ctx, self.observer, self.refit)
        self.launches = Launches(ctx, self.ends, launch_health, scripts_dir)
        self.tuning = SelfTuning(store, clock())   # self-tuned plan() settings (tune.py)
        self.schedule = Schedule(ctx, self.adapt, self.launches, launch_health, self.fairshare,
                                 lambda: self.model, self.tuning.applied)
        self.clean = Clean(ctx)
        # forecasts off the round, in a thread of their own (controller/foresight.py): the
        # runtime starts it (``foresight.start()``) and the service reads it
        self.foresight = Foresight()
        self.schedule.foresight = self.foresight
        self.refit()

    # ------------------------------------------------------------------ the round
    def tick(self) -> None:
        now = self.clock()
        self.ctx.decoded.sweep()   # keep only what last round read: its jobs and questions
        snapshot = self.poll.run(self.round_wait_s)
        for node in snapshot.nodes:
            if node.reached:
                self.reconcile.run(node)
                self.clean.orphans(node.name)
        self.lose.run(now)
        self.limits.run(now)
        self.idle.step(self.ctx, snapshot, now)   # idle GPU holders: mark, notify, act (idle.py)
        self.foreign.step(self.ctx, snapshot, now)   # foreign idle GPU holders (foreign.py)
        self.cancels.run(snapshot)
        profiles, lab = self.profiler.run(snapshot)
        speeds = self.speeds.run(snapshot, now, profiles, lab)
        self.adapt.step(now, speeds, snapshot)
        self.adapt.phase_step(now, snapshot, profiles, lab)   # phase changes refresh profiles
        self.tuning.step(now, self.inventory)   # self-tuning: a replay due, or its answer
        self.schedule.progress_left = self.observer.work_left()   # for the forecast
        self.schedule.run(snapshot, profiles)
        self.clean.old_dirs(snapshot, now)

    def close(self) -> None:
        self.foresight.close()
        self.actions.close()
        self.pool.close()

    def use(self, inventory: Inventory, pool: Pool) -> None:
        """A reloaded inventory and its node pool, from now on (called between rounds)."""
        self.ctx.inventory, self.ctx.pool, self.observer.pool = inventory, pool, pool

    def fence(self, node: str, by: str) -> list[int]:
        """An admin declares every attempt on ``node`` dead (``steps/lose.py``)."""
        return self.lose.fence(node, by)

    def launch_health(self) -> dict[str, dict]:
        """Nodes skipped because their launches fail: node -> {reason, until}."""
        return self.launches.launch_health()

    def script_copy(self, job: Job) -> Path:
        """The copy of the script taken when the job was submitted (``steps/launch.py``)."""
        return self.launches.script_copy(job)

    # ------------------------------------------------------------------ shared parts
    # store, inventory, pool, actions, clock, jobs() and move(): OnContext's, over self.ctx
    def requeue(self, job: Job, reason: str, *, started: bool, **fields: Any) -> Job:
        """``job`` back to the queue, its attempt dropped (``store.jobrows.requeue``)."""
        return self.ctx.requeue(job, reason, started=started, **fields)

    # ------------------------------------------------------------------ model
    @property
    def round_wait_s(self) -> float:
        """How long a round waits for slow nodes: never longer than one poll interval, so one
        sick node cannot make every other node's data old."""
        return min(max(1.0, self.inventory.poll_interval_s), 10.0)

    def refit(self) -> None:
        """Refit the model (after new measurements: the observe step, and a phase change in
        ``controller/adaptation.py``). In the background (the controller): in a child process at low
        priority (controller/refit.py), so a fit never holds this interpreter's lock against a
        round; one at a time, and a request during a fit runs one more afterwards."""
        if not self._fit_in_background:
            self._fit()
            return
        with self._fit_lock:
            if self._fit_running:
                self._fit_again = True
                return
            self._fit_running = True
        threading.Thread(target=self._fit_in_child, name="iadeep-fit", daemon=True).start()

    def _fit_in_child(self) -> None:
        from ..model.predictor import InterferenceModel
        from . import refit

        out = self.store.path.with_name("interference-model.json")
        while True:
            try:
                done = refit.run(self.store.path, out, timeout_s=REFIT_TIMEOUT_S)
                if done.returncode != 0:
                    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    log.error("refitting the interference model failed (exit %s: %s); keeping "
                              "the current model", done.returncode, last)
                else:
                    self.model = InterferenceModel.load(out)
                    log.info("interference model ready: %s", self.model.note)
            except Exception:  # keep scheduling with the current model rather than stop
                log.exception("refitting the interference model failed; keeping the current "
                              "model")
            with self._fit_lock:
                if not self._fit_again:
                    self._fit_running = False
                    return
                self._fit_again = False

    def _fit(self) -> None:
        from ..model.data import shipped_pairs, shipped_profiles
        from ..model.predictor import fit_model
        from .catalog import lab_measurements

        try:
            lab_profiles, lab_pairs = lab_measurements(self.store)
            self.model = fit_model(shipped_profiles(), shipped_pairs(),
                                   extra_profiles=lab_profiles, extra_observations=lab_pairs)
            log.info("interference model ready: %s", getattr(self.model, "note", ""))
        except Exception:  # keep scheduling with the analytic model rather than stop
            log.exception("fitting the interference model failed; using the analytic estimate")

"""One scheduling round, as a list of named steps (``SchedulingLoop.tick``).

    poll       steps/poll.py       every node's GPUs and its jobs' states, one round trip a node
    reconcile  steps/reconcile.py  each job on a node that answered, in line with its poll
    (clean)    steps/clean.py      ...and that node's abandoned attempts stopped, set aside
    lose       steps/lose.py       jobs of nodes silent past their grace: lost (and fencing)
    limits     steps/limits.py     jobs past their --time asked to stop (--signal first)
    idle       steps/idle.py       running jobs whose GPUs sit idle: marked, owner told, acted on
    foreign    steps/foreign.py    foreign processes holding a GPU idle: recorded, admins told
    cancels    steps/cancels.py    stops sent for the jobs whose cancel was asked for
    profile    steps/profile.py    new workloads sampled alone on their GPU, then profiled
    observe    steps/observe.py    running jobs' speeds and co-location pairs recorded (refit)
    adapt      steps/adaptation.py a shared GPU gone wrong: closed, a job suspended; phases
    tune       steps/tune.py       self-tuning: a what-if replay due (a child), or its answer
    schedule   steps/schedule.py   the queue placed (the pure ``plan()``), placements launched
    clean      steps/clean.py      finished jobs' old directories removed on their nodes

Each step is a small class over the controller's shared parts (``context.Context``: the store,
the inventory and its node pool, the per-node workers, the clock), given what else it needs
when the loop builds it, and run as ``run(round)`` (``context.Round``: what the round found so
far, each step adding what it finds); the ends of an attempt (``steps/ends.py``) and a launch
(``steps/launch.py``) are shared by the steps that need them.

Why this order: the truth on the nodes (reconcile) is established before anything is decided,
so a restarted controller never starts a job that is already running. A launch is recorded as
``starting`` (with node and GPUs) and committed *before* the job is started on the node; if the
controller dies in between, the next round's reconcile finds either the job's pid file (it did
start: running) or nothing (it did not: queued again). A job is therefore never started twice.

Nodes never wait for each other. Every poll reads a node's GPUs *and* the state of its jobs in
one round trip; the round waits for the nodes only briefly (``Poll.wait_s``) and a slow node's
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

from ...jobs import Job
from ...nodes.connection import Pool
from ...scheduler.prediction import Predictor
from ...settings import Inventory
from ...store import Store
from ..fairshare import FairShareRound
from ..foresight import Foresight
from .actions import NodeActions
from .context import Context, OnContext, Round, RoundStep
from .steps import foreign, idle
from .steps.backoff import Backoff
from .steps.cancels import Cancels
from .steps.clean import Clean
from .steps.ends import Ends
from .steps.launch import Launches
from .steps.limits import Limits
from .steps.lose import Lose
from .steps.observe import Observe
from .steps.poll import Poll
from .steps.profile import Profiler
from .steps.reconcile import Reconcile
from .steps.schedule import Schedule
from .steps.tune import SelfTuning

__all__ = ["NodeActions", "SchedulingLoop"]
log = logging.getLogger("iadeep.controller")
REFIT_TIMEOUT_S = 1800.0    # a refit child still running after this is killed (and logged)


class SchedulingLoop(OnContext):
    """The controller's scheduling round (``tick``), the steps it runs and the model they share.

    Public to the rest of the controller (runtime, the service's port): ``tick``, ``close``,
    ``use``, ``fence``, ``launch_health``, ``script_copy``, ``refit`` and the shared parts
    (``store``, ``inventory``, ``pool``, ``actions``, ``clock``, ``model``, ``observer``).
    Every step is ``run(round)`` over the round's context (``context.Round``, ``Context``)."""

    def __init__(self, store: Store, inventory: Inventory, pool: Pool, scripts_dir: Path,
                 clock: Callable[[], float] = time.time, fit_in_background: bool = True):
        from ...model.predictor import analytic_model
        from .observer import SpeedObserver
        from .steps.adaptation import Adapter

        self.ctx = ctx = Context(store, inventory, pool, NodeActions(), clock)
        self.scripts_dir = scripts_dir
        self.model: Predictor = analytic_model()   # conservative until the fitted one is ready
        self.observer = SpeedObserver(pool)
        self._fit_in_background = fit_in_background
        self._fit_lock = threading.Lock()
        self._fit_running = self._fit_again = False
        launch_health: Backoff = {}   # nodes whose launches fail, skipped a while
        self.fairshare = FairShareRound()   # lab.policy.fairshare: usage -> priority points
        # the round's steps, built before whoever uses them (no step reaches for a later one)
        self.poll = Poll(ctx, self.observer)
        self.clean = Clean(ctx)
        self.profiler = Profiler(ctx, self.observer)
        self.speeds = Observe(ctx, self.observer, self.refit)
        self.adapt = Adapter(ctx, self.observer, self.refit)   # run-time adaptation
        self.ends = Ends(ctx, self.adapt, launch_health, self.profiler.forget, self.speeds.learnt)
        self.reconcile = Reconcile(ctx, self.ends, self.clean)
        self.lose = Lose(ctx, self.ends)
        self.limits = Limits(ctx)
        self.idle = idle.IdleWatch(ctx)   # running jobs whose GPUs sit idle (steps/idle.py)
        self.foreign = foreign.ForeignWatch(ctx)   # foreign processes holding a GPU idle
        self.cancels = Cancels(ctx)
        self.launches = Launches(ctx, self.ends, launch_health, scripts_dir)
        self.tuning = SelfTuning(store, clock())   # self-tuned plan() settings (steps/tune.py)
        # forecasts off the round, in a thread of their own (controller/foresight.py, shared
        # with the service): the schedule step hands it each round's inputs, the runtime starts
        # it and gives the service its forecasts through the port (``forecasts()``)
        self.foresight = Foresight()
        self.schedule = Schedule(ctx, self.adapt, self.launches, launch_health, self.fairshare,
                                 self.current_model, self.tuning.applied,
                                 foresight=self.foresight, work_left=self.observer.work_left)
        # ... and the order tick() runs them in (see the module docstring)
        self.steps: tuple[tuple[str, RoundStep], ...] = (
            ("poll", self.poll), ("reconcile", self.reconcile), ("lose", self.lose),
            ("limits", self.limits), ("idle", self.idle), ("foreign", self.foreign),
            ("cancels", self.cancels), ("profile", self.profiler), ("observe", self.speeds),
            ("adapt", self.adapt), ("tune", self.tuning), ("schedule", self.schedule),
            ("clean", self.clean))
        self.refit()

    # ------------------------------------------------------------------ the round
    def tick(self) -> None:
        r = Round(now=self.clock(), inventory=self.inventory)
        self.ctx.decoded.sweep()   # keep only what last round read: its jobs and questions
        for _name, step in self.steps:
            step.run(r)

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

    def launch_health(self) -> dict[str, dict[str, Any]]:
        """Nodes skipped because their launches fail: node -> {reason, until}."""
        return self.launches.launch_health()

    def script_copy(self, job: Job) -> Path:
        """The copy of the script taken when the job was submitted (``steps/launch.py``)."""
        return self.launches.script_copy(job)

    # ------------------------------------------------------------------ shared parts
    # store, inventory, pool, actions, clock, jobs() and move(): OnContext's, over self.ctx
    # ------------------------------------------------------------------ model
    def current_model(self) -> Predictor:
        """The interference model in use (the fitted one once a refit has finished)."""
        return self.model

    def refit(self) -> None:
        """Refit the model (after new measurements: the observe step, and a phase change in
        ``steps/adaptation.py``). In the background (the controller): in a child process at low
        priority (controller/round/refit.py), so a fit never holds this interpreter's lock against a
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
        from ...model.predictor import InterferenceModel
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
        from ...model.data import shipped_pairs, shipped_profiles
        from ...model.predictor import fit_model
        from ..catalog import lab_measurements

        try:
            lab_profiles, lab_pairs = lab_measurements(self.store)
            self.model = fit_model(shipped_profiles(), shipped_pairs(),
                                   extra_profiles=lab_profiles, extra_observations=lab_pairs)
            log.info("interference model ready: %s", getattr(self.model, "note", ""))
        except Exception:  # keep scheduling with the analytic model rather than stop
            log.exception("fitting the interference model failed; using the analytic estimate")

"""Step: observe the running jobs' speeds (their progress reports, their GPUs' utilisation),
record them and the co-location pairs they show, and refit the model when enough are new."""
from __future__ import annotations

import logging
from collections.abc import Callable

from ....jobs import JobState
from ....profiles import Profile
from ....snapshot import ClusterSnapshot
from ....store import impact, jobrows, profiles as profrows
from ..context import Context, Round, Step
from ..observer import SpeedObserver

log = logging.getLogger("iadeep.controller")
REFIT_INTERVAL_S = 3600.0   # refit the model at most this often, when new pairs were observed


class Observe(Step):
    def __init__(self, ctx: Context, observer: SpeedObserver, refit: Callable[[], None]):
        super().__init__(ctx)
        self.observer = observer   # controller/round/observer.SpeedObserver
        self._refit = refit        # SchedulingLoop.refit
        self._new_pairs = 0
        self._last_fit = ctx.clock()

    def learnt(self, pairs: int) -> None:
        """``pairs`` co-locations recorded outside this step (a job out of GPU memory beside
        another, ``steps/oom.py``): they count towards the next refit like observed ones."""
        self._new_pairs += pairs

    def run(self, r: Round) -> None:
        r.speeds = self.observe(r.snapshot, r.now, r.profiles, r.lab)

    def observe(self, snapshot: ClusterSnapshot, now: float, profiles: dict[str, Profile],
                lab: dict[str, Profile]) -> dict[int, float]:
        """Each running job's observed speed this round (job id -> speed), recorded."""
        # Solo rates only of workloads this lab profiled itself (the shipped ones are other
        # programs with other batch sizes).
        known_solo = {name: p.solo_it_per_s for name, p in lab.items() if p.solo_it_per_s}
        known_util = {name: p.gpu_util for name, p in profiles.items() if p.gpu_util}
        answered = {n.name for n in snapshot.nodes if n.reached}
        running = [j for j in self.jobs({JobState.RUNNING}) if j.node in answered]
        self.observer.window_s = self.inventory.policy.adapt.window_s
        speeds, pairs = self.observer.observe(running, snapshot, now, known_solo, known_util)
        with self.store.tx() as conn:
            for job_id, speed in speeds.items():
                jobrows.update(conn, job_id, observed_speed=round(speed, 4))
            # each row is its jobs' owners' word until another member's jobs agree
            for pair, (a, b) in zip(pairs, self.observer.pair_jobs, strict=True):
                row, kind = profrows.add_colocation(
                    conn, pair, now, owners=(a.owner, b.owner),
                    note=f"progress of jobs {a.id} ({a.owner}) and {b.id} ({b.owner})")
                if kind == "held":
                    log.info("co-location %s next to %s at %s held as %s's (row %d)",
                             *pair.jobs, pair.speeds, ", ".join(sorted({a.owner, b.owner})),
                             row)
            # the impact factor's accounting: work at these speeds, busy time, power
            impact.tick(conn, self.clock(), speeds, impact.power_of(snapshot))
        self._new_pairs += len(pairs)
        if self._new_pairs and now - self._last_fit >= REFIT_INTERVAL_S:
            log.info("refitting the model with %d new co-location measurements", self._new_pairs)
            self._new_pairs, self._last_fit = 0, now
            self._refit()
        return speeds

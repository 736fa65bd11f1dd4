"""Forecasts off the scheduling round: a thread of its own runs ``scheduler.forecast`` on what
the last round saw, and keeps the answer for readers (``queue why``, ``queue list``, ``run``,
the monitor and the web page, through the service).

The round only hands its inputs over (``offer``: a reference, no copy, no wait); the thread
forecasts when the inputs changed (a job queued, placed or ended, or a job's reported progress)
and at least ``EVERY_S`` after its last forecast, and at most every ``MIN_GAP_S`` (so a busy
queue costs at most one forecast per ``MIN_GAP_S``: bench_forecast.py measures one). A round
never waits for a forecast, and a forecast failing never fails a round: it is logged and the
last good one kept.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..jobs import Job, JobSpec, JobState
from ..messages import ForecastView, TrialResult
from ..scheduler import forecast as fc
from ..scheduler.placement import GpuSlot
from ..scheduler.remaining import RuntimeEstimate

log = logging.getLogger("iadeep.controller")
MIN_GAP_S = 5.0     # at most one forecast per 5 s ...
EVERY_S = 60.0      # ... and one at least every minute (the clock moves the answer too)
TRIAL_ID = 10 ** 15   # `queue add --test-only`'s job: after every real one in the queue's order


@dataclass(frozen=True)
class Inputs:
    """What one forecast needs, as the round had it (its plan() bound in ``decide``)."""

    queue: Sequence[Job]
    slots: Sequence[GpuSlot]
    active: Sequence[Job]
    now: float
    decide: fc.Decide
    left: Callable[[Job], fc.Left]
    runtime: Callable[[Job], RuntimeEstimate]
    group_speed: Callable[[Sequence[Job]], Sequence[float]]
    memory: Callable[[Job], float | None]
    order: Callable[[Sequence[Job], float], list[Job]]
    key: tuple = ()   # what changed means a new forecast (queue, placements, progress)
    lag_s: float = 0.0   # from a GPU freeing to the next job running there (forecast())
    # plan() with waiting reasons (``decide`` gives none: fc.planner), for ``trial``'s reason
    explain: fc.Decide | None = None


class Foresight:
    """The latest forecast, made in a thread of its own (``start``; ``close`` stops it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 min_gap_s: float = MIN_GAP_S, every_s: float = EVERY_S):
        self._clock = clock
        self.min_gap_s = min_gap_s
        self.every_s = every_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._inputs: Inputs | None = None
        self._done_key: tuple | None = None
        self._done_at = float("-inf")
        self._latest: fc.Forecast | None = None
        self._thread: threading.Thread | None = None
        self.cpu_s = 0.0   # the last forecast's CPU time (its thread's)

    # ------------------------------------------------------------------ the round's side
    def offer(self, inputs: Inputs) -> None:
        """The round's inputs: kept (the previous ones dropped), the thread woken."""
        with self._lock:
            self._inputs = inputs
        self._wake.set()

    # ------------------------------------------------------------------ the readers' side
    def latest(self) -> fc.Forecast | None:
        with self._lock:
            return self._latest

    def of(self, job_id: int) -> ForecastView | None:
        got = self.latest()
        if got is None:
            return None
        f = got.jobs.get(job_id)
        return None if f is None else f.at(got.made_at)

    def starts(self) -> Mapping[int, fc.JobForecast]:
        got = self.latest()
        return {} if got is None else got.jobs

    def trial(self, owner: str, spec: JobSpec, now: float) -> TrialResult | None:
        """``queue add --test-only``: plan() and the forecast over the last round's inputs
        with a job of ``spec`` added (submitted ``now``, after every job queued); None before
        the first round. Runs in the caller's thread (a request's), never the round's."""
        with self._lock:
            inputs = self._inputs
        if inputs is None:
            return None
        job = Job(TRIAL_ID, owner, spec, JobState.QUEUED, max(now, inputs.now))
        queue = [*inputs.queue, job]
        decided = (inputs.explain or inputs.decide)(queue, inputs.slots, inputs.active,
                                                    inputs.now)
        if any(p.job_id == TRIAL_ID for p in decided.placements):
            reason = ""
        else:
            reason = decided.waits.get(TRIAL_ID, "")
        got = fc.forecast(queue, inputs.slots, inputs.active, now=inputs.now,
                          decide=inputs.decide, left=inputs.left, runtime=inputs.runtime,
                          group_speed=inputs.group_speed, memory=inputs.memory,
                          order=inputs.order, lag_s=inputs.lag_s)
        f = got.jobs.get(TRIAL_ID)
        view = None if f is None else f.at(got.made_at)
        return TrialResult(not reason and f is not None and f.start == inputs.now, reason,
                           view)

    # ------------------------------------------------------------------ the thread
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="iadeep-forecast",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def due(self) -> Inputs | None:
        """The inputs to forecast now, if a forecast is due."""
        with self._lock:
            inputs = self._inputs
        if inputs is None:
            return None
        age = self._clock() - self._done_at
        if age < self.min_gap_s:
            return None
        if inputs.key == self._done_key and age < self.every_s:
            return None
        return inputs

    def step(self) -> bool:
        """One forecast if one is due (the thread's loop body; tests call it directly)."""
        inputs = self.due()
        if inputs is None:
            return False
        cpu = time.thread_time()
        try:
            got = fc.forecast(inputs.queue, inputs.slots, inputs.active, now=inputs.now,
                              decide=inputs.decide, left=inputs.left, runtime=inputs.runtime,
                              group_speed=inputs.group_speed, memory=inputs.memory,
                              order=inputs.order, lag_s=inputs.lag_s)
        except Exception:   # a forecast never takes the controller down: keep the last one
            log.exception("forecast failed; keeping the previous one")
            got = None
        self.cpu_s = time.thread_time() - cpu
        with self._lock:
            if got is not None:
                self._latest = got
            self._done_key = inputs.key
            self._done_at = self._clock()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=self.min_gap_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            if not self.step():
                # due later: wake again once the gap since the last forecast has passed
                self._stop.wait(timeout=max(0.1, self.min_gap_s / 2))
                if self.due() is not None:
                    self._wake.set()

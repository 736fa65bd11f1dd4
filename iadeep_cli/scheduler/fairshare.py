"""Fair share: how much a user's recent GPU use lowers the priority of their waiting jobs.

Pure functions and one pure accumulator, shared by the controller (fed from its database's
events) and the simulator (fed from its own starts and ends), so both rank a queue the same way.
Nothing here reads a clock or a file: the caller says what ran and when, and what "now" is.

The model is Slurm's classic fair-share factor (docs/scheduling.md "Fair share"):

    usage_u    = sum over u's jobs of  GPUs x integral over the time they held them of
                 2^(-(now - t) / half_life) dt         (decayed GPU-seconds)
    usage_norm = usage_u / sum of every user's usage    (0 while nobody used anything)
    share_norm = share_u / sum of the shares of the users that count now
    F          = 2^(-usage_norm / share_norm)           (1: no use; 0.5: used exactly its share)
    points     = weight x F                             (added to priority + aging)

Where it departs from Slurm, and why:

- Flat: one level of users, no account tree; a lab has no departments to divide between.
- Users who count for ``share_norm``: those named in ``shares``, those with decayed usage and
  those with a job waiting or running now (Slurm counts every association it knows; iadeep has
  no user registry, and a student who left years ago should not dilute anyone's share). A user
  not named in ``shares`` has share 1.
- Decay is exact and continuous (the integral above, in closed form) instead of Slurm's usage
  halved in steps every ``PriorityCalcPeriod``: the same figure whenever a round happens.
- Usage is GPUs x time a job held them (``starting`` or ``running``, as in ``iadeep report``;
  time ``lost`` is not counted), not a TRES-billing mix of CPUs and memory.
- Aging stays unbounded (``aging_per_hour``, no PriorityMaxAge), so starvation is impossible:
  fair share moves a job by at most ``weight`` points, which aging makes up in
  ``weight / aging_per_hour`` hours.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..settings import FairShare

LN2 = math.log(2.0)
HELD = frozenset({"starting", "running"})   # the states in which a job holds its GPUs


def decayed(start: float, end: float, gpus: float, ref: float, half_life_s: float) -> float:
    """GPU-seconds of ``gpus`` held over [start, end], each second weighted by
    2^(-(ref - t)/half_life): the closed form of the integral (0 for an empty interval)."""
    if end <= start:
        return 0.0
    k = half_life_s / LN2
    return float(gpus * k * (2.0 ** (-(ref - end) / half_life_s)
                             - 2.0 ** (-(ref - start) / half_life_s)))


class UsageLedger:
    """Each user's decayed GPU-seconds, kept up to date from the moves of jobs into and out of
    the states that hold GPUs, so a round costs the moves since the last round, not a scan of
    the whole history.

    Closed intervals are folded into one number per user, decayed to ``_as_of`` (multiplying
    by 2^(-dt/half_life) moves every closed interval's weight forward at once); open ones (jobs
    holding GPUs now) are integrated up to the asked time. ``cursor`` is for the caller: the
    last event id fed (the controller's database), so a restarted controller rebuilds the same
    figures from the same events.
    """

    def __init__(self, half_life_s: float):
        if not half_life_s > 0:
            raise ValueError(f"half-life must be > 0, got {half_life_s}")
        self.half_life_s = half_life_s
        self.cursor = 0
        self._closed: dict[str, float] = {}
        self._as_of = 0.0
        self._open: dict[int, tuple[str, float, float]] = {}   # job id -> (user, gpus, since)

    def restore(self, cursor: int, ref: float, sums: Mapping[str, float],
                held: Iterable[tuple[int, str, float, float]]) -> None:
        """Start from the whole recorded history at once (``store.usage.history``): per user
        the sum over their moves of +-GPUs x 2^((at - ref)/half_life) (+ out of holding GPUs,
        - into), and the jobs holding GPUs now (job id, user, GPUs, since). A finished
        interval [a, b] contributes w(b) - w(a), i.e. ``decayed(a, b)`` times ln2/half_life;
        an open one only its -w(since), cancelled here as it becomes an open interval."""
        k = self.half_life_s / LN2
        closed = {u: v * k for u, v in sums.items()}
        self._open = {}
        for job_id, user, gpus, since in held:
            closed[user] = closed.get(user, 0.0) + k * gpus * 2.0 ** (
                (since - ref) / self.half_life_s)
            self._open[job_id] = (user, gpus, since)
        self._closed = {u: max(0.0, v) for u, v in closed.items()}   # rounding: never < 0
        self._as_of = ref
        self.cursor = cursor

    def start(self, job_id: int, user: str, gpus: float, at: float) -> None:
        """Job ``job_id`` of ``user`` holds ``gpus`` GPUs from ``at`` (a second start of a
        job already holding them is ignored: starting -> running is one interval)."""
        self._open.setdefault(job_id, (user, gpus, at))

    def stop(self, job_id: int, at: float) -> None:
        """Job ``job_id`` released its GPUs at ``at`` (ignored if it held none)."""
        held = self._open.pop(job_id, None)
        if held is None:
            return
        user, gpus, since = held
        self._decay_to(max(self._as_of, at))
        self._closed[user] = self._closed.get(user, 0.0) + decayed(
            since, at, gpus, self._as_of, self.half_life_s)

    def feed(self, moves: Iterable[tuple[int, int, str, float, float, str | None, str]]
             ) -> None:
        """Events as the store gives them: (event id, job id, owner, GPUs, at, old state, new
        state), in id order. Moves between two holding states, or two others, change nothing."""
        for event_id, job_id, owner, gpus, at, old, new in moves:
            was, now = old in HELD, new in HELD
            if now and not was:
                self.start(job_id, owner, gpus, at)
            elif was and not now:
                self.stop(job_id, at)
            self.cursor = max(self.cursor, event_id)

    def usage(self, now: float) -> dict[str, float]:
        """Each user's decayed GPU-seconds at ``now`` (users whose usage decayed below one
        GPU-millisecond are forgotten, so the table does not grow for ever)."""
        self._decay_to(max(self._as_of, now))
        back = 2.0 ** (-(now - self._as_of) / self.half_life_s)   # 1 unless now < _as_of
        out = {u: v * back for u, v in self._closed.items()}
        for user, gpus, since in self._open.values():
            out[user] = out.get(user, 0.0) + decayed(since, now, gpus, now, self.half_life_s)
        return out

    def _decay_to(self, t: float) -> None:
        if t <= self._as_of:
            return
        factor = 2.0 ** (-(t - self._as_of) / self.half_life_s)
        self._closed = {u: v * factor for u, v in self._closed.items() if v * factor > 1e-3}
        self._as_of = t


@dataclass(frozen=True)
class UserShare:
    """One user's fair-share figures for one round (what `queue why` shows)."""

    user: str
    usage_gpu_h: float      # decayed GPU-hours
    usage_norm: float       # of everyone's decayed usage (0..1)
    share: float
    share_norm: float       # of the shares of the users that count now (0..1]
    factor: float           # F = 2^(-usage_norm/share_norm), in (0, 1]
    points: float           # weight x F: what it adds to the job's priority


def shares(usage: Mapping[str, float], users: Iterable[str], settings: FairShare
           ) -> dict[str, UserShare]:
    """Each counting user's figures from decayed ``usage`` (GPU-seconds per user) for the
    users with jobs waiting or running (``users``); see the module's formula."""
    counted = set(users) | {u for u, v in usage.items() if v > 0} | {u for u, _ in
                                                                      settings.shares}
    total_share = sum(settings.share(u) for u in counted)
    total_use = sum(max(0.0, usage.get(u, 0.0)) for u in counted)
    out = {}
    for u in sorted(counted):
        use = max(0.0, usage.get(u, 0.0))
        share_norm = settings.share(u) / total_share
        usage_norm = use / total_use if total_use > 0 else 0.0
        factor = 2.0 ** (-usage_norm / share_norm)
        out[u] = UserShare(u, use / 3600.0, usage_norm, settings.share(u), share_norm, factor,
                           settings.weight * factor)
    return out


def points(table: Mapping[str, UserShare]) -> dict[str, float]:
    """What ``plan()`` takes: priority points per user."""
    return {u: s.points for u, s in table.items()}

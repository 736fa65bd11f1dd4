"""How much a job still has to run, as far as anyone can know: pure, no I/O, no clock.

Nobody knows a training job's length in advance, but three things say something about it:

- the lab's history: the run times of its finished jobs, per workload label, fitted as a
  log-normal (run times spread over orders of magnitude); a label with few runs borrows from
  the lab-wide fit (shrinkage by sample count), and with no history at all a broad prior
  (median ``PRIOR_MEDIAN_S``, ``PRIOR_SIGMA``) stands in;
- its ``--time``: it stops then at the latest (the distribution is cut there);
- how long it has already run: under such a spread, a job that has run long is likely to run
  long yet (the hazard falls with age), one that just started may well end soon.

``Durations.index(workload, limit, age)`` condenses this into one number per job, its
*completion index*: the Gittins index of its remaining run time, the best ratio, over any
horizon, of the chance it finishes within the horizon to the GPU time it takes meanwhile, in
completions per second of full speed. A job at speed ``s`` contributes ``s x index`` to the
rate at which the lab finishes jobs, and the mean JCT falls when that rate is high (Little's
law). Placement (``placement.py``) weighs a sharing decision by it: a newcomer starting now at
its shared speed, against what its partners lose, each weighted by its index. So a job that
has run for hours (low index: it will likely run hours more) is a good partner for a
newcomer, and one that probably ends within minutes (high index) is left alone to finish.

``estimate_runtime(...)`` answers the plainer question a reservation and ``queue why`` ask:
how long will this job run in all, with a low and a high figure (the 10% and 90% quantiles)
and where that came from: its ``--time`` (a cap: it stops then at the latest), else the lab's
history of the same user and label, of the user, of the label, of the whole lab, else
``DEFAULT_RUNTIME_S``; or, for a job with a ``--time`` whose user (else the lab) has a history
of runs with one, its ``--time`` times the learnt ratio of run time to ``--time`` (users
tend to ask for about the same multiple of what they need), when that ratio spreads less than
the run times do.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

PRIOR_MEDIAN_S = 3600.0     # no history: run times around an hour ...
PRIOR_SIGMA = 1.5           # ... spread over orders of magnitude (x4.5 per sigma)
PRIOR_WEIGHT = 5.0          # a label's own runs outweigh the lab-wide fit from this many
MIN_RUN_S = 1.0             # shorter run times (a crash at start) count as this long
_STEPS = tuple(1.25 ** k for k in range(1, 48))   # horizons: 25% apart, up to ~45,000 x
_SQRT2 = math.sqrt(2.0)
# estimate_runtime: the quantiles it reports, and the run time it assumes with no history and
# no --time (the prior's median: a stated default, not a measurement)
LOW_Q, HIGH_Q = 0.10, 0.90
DEFAULT_RUNTIME_S = PRIOR_MEDIAN_S
MIN_HISTORY = 3   # runs of a user (or user and label) before their own history is used
RATIO_SOURCE = "--time x history"   # estimate_runtime: --time times the learnt ratio


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / _SQRT2))


@dataclass(frozen=True)
class LogNormal:
    """Run time distribution: ``ln(seconds)`` ~ Normal(mu, sigma); ``n``: runs it rests on."""

    mu: float
    sigma: float
    n: float = 0.0

    @property
    def median_s(self) -> float:
        return math.exp(self.mu)

    def cdf(self, x: float) -> float:
        return 0.0 if x <= 0 else _phi((math.log(x) - self.mu) / self.sigma)

    def served(self, x: float) -> float:
        """E[min(D, x)]: the GPU time a job takes up to ``x`` on average."""
        if x <= 0:
            return 0.0
        z = (math.log(x) - self.mu) / self.sigma
        partial = math.exp(self.mu + self.sigma ** 2 / 2) * _phi(z - self.sigma)
        return partial + x * (1.0 - _phi(z))


PRIOR = LogNormal(math.log(PRIOR_MEDIAN_S), PRIOR_SIGMA)


class _Sums:
    __slots__ = ("n", "s1", "s2")

    def __init__(self) -> None:
        self.n, self.s1, self.s2 = 0, 0.0, 0.0

    def add(self, seconds: float) -> None:
        self.add_log(math.log(max(MIN_RUN_S, seconds)))

    def add_log(self, x: float) -> None:
        self.n += 1
        self.s1 += x
        self.s2 += x * x

    def fit(self, prior: LogNormal, weight: float) -> LogNormal:
        """The posterior-mean log-normal: the prior counts as ``weight`` runs; with few runs
        the spread is widened by the uncertainty of the mean (predictive distribution)."""
        n = self.n
        if n == 0:
            return prior
        mu = (self.s1 + weight * prior.mu) / (n + weight)
        ss = self.s2 - 2 * mu * self.s1 + n * mu * mu            # sum (x - mu)^2
        var = (ss + weight * (prior.sigma ** 2 + (prior.mu - mu) ** 2)) / (n + weight)
        var *= 1.0 + 1.0 / (n + weight)
        return LogNormal(mu, max(0.2, math.sqrt(max(var, 0.0))), n)


class Durations:
    """Observed run times per workload label, and each job's completion index from them.

    ``add`` records a finished run (the controller from its database, the simulator as jobs
    finish); placement only reads. Indexes are memoised by (label, limit, age bucket of 10%),
    so a round over a thousand jobs computes a few dozen."""

    def __init__(self, samples: Iterable[tuple[str | None, float]
                                         | tuple[str | None, float, str | None]
                                         | tuple[str | None, float, str | None, float | None]
                                         ] = (),
                 prior: LogNormal = PRIOR):
        self.prior = prior
        self._all = _Sums()
        self._by: dict[str, _Sums] = {}
        # per user, and per (user, label): estimate_runtime's history (the index keeps to labels)
        self._user: dict[str, _Sums] = {}
        self._pair: dict[tuple[str, str], _Sums] = {}
        # run time over --time (log), per user and lab-wide: how far users' limits overshoot
        self._ratio_all = _Sums()
        self._ratio: dict[str, _Sums] = {}
        self._fits: dict[str, LogNormal] = {}
        self._sources: dict[str, str] = {}
        self._memo: dict[tuple[Any, ...], float] = {}
        for sample in samples:
            self.add(*sample)

    def add(self, workload: str | None, seconds: float, user: str | None = None,
            limit_s: float | None = None) -> None:
        """One finished run: its label, its run time (start to end), its owner if known, and
        its --time if it had one (the ratio of the two is learnt too: ``ratio_dist``)."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            return
        if limit_s is not None and limit_s > 0 and math.isfinite(limit_s):
            x = math.log(max(MIN_RUN_S, min(seconds, limit_s)) / limit_s)
            self._ratio_all.add_log(x)
            if user:
                self._ratio.setdefault(user, _Sums()).add_log(x)
        self._all.add(seconds)
        if workload:
            self._by.setdefault(workload, _Sums()).add(seconds)
        if user:
            self._user.setdefault(user, _Sums()).add(seconds)
            if workload:
                self._pair.setdefault((user, workload), _Sums()).add(seconds)
        self._fits.clear()
        if self._memo:
            self._memo = {}

    def runtime_dist(self, user: str | None, workload: str | None) -> tuple[LogNormal, str]:
        """The run time distribution ``estimate_runtime`` uses, and what it rests on: the user's
        runs of this label (shrunk toward the label's, else the user's), the label's, the
        user's, else the prior ("default")."""
        key = f"\0{user or ''}\0{workload or ''}"
        hit = self._fits.get(key)
        if hit is not None:
            return hit, self._sources[key]
        label = self._by.get(workload) if workload else None
        mine = self._user.get(user) if user else None
        pair = self._pair.get((user, workload)) if user and workload else None
        lab = self._all.fit(self.prior, 1.0)
        if pair is not None and pair.n >= MIN_HISTORY:
            base = self.dist(workload) if label is not None else mine.fit(lab, PRIOR_WEIGHT) \
                if mine is not None else lab
            hit, source = pair.fit(base, 1.0), "user+label history"
        elif mine is not None and mine.n >= MIN_HISTORY:
            base = self.dist(workload) if label is not None else lab
            hit, source = mine.fit(base, 1.0), "user history"
        elif label is not None:
            hit, source = self.dist(workload), "label history"
        elif self._all.n:
            hit, source = lab, "lab history"
        else:
            hit, source = self.prior, "default"
        self._fits[key] = hit
        self._sources[key] = source
        return hit, source

    def ratio_dist(self, user: str | None) -> LogNormal | None:
        """The distribution of ``ln(run time / --time)`` of ``user``'s runs that had a --time
        (shrunk toward the lab's), else the lab's; None with fewer than ``MIN_HISTORY`` runs
        with a --time. Users who ask for about the same multiple of what their jobs need make
        their --time a better guide to the run time than the label's history."""
        if self._ratio_all.n < MIN_HISTORY:
            return None
        key = f"\0ratio\0{user or ''}"
        hit = self._fits.get(key)
        if hit is None:
            lab = self._ratio_all.fit(LogNormal(math.log(0.5), 1.0), 1.0)
            mine = self._ratio.get(user) if user else None
            hit = mine.fit(lab, 1.0) if mine is not None and mine.n >= MIN_HISTORY else lab
            self._fits[key] = hit
        return hit

    @property
    def runs(self) -> int:
        return self._all.n

    def dist(self, workload: str | None) -> LogNormal:
        """The label's fitted distribution, shrunk toward the lab-wide one."""
        key = workload or ""
        hit = self._fits.get(key)
        if hit is None:
            lab = self._all.fit(self.prior, 1.0)
            own = self._by.get(key)
            hit = own.fit(lab, PRIOR_WEIGHT) if own is not None else lab
            self._fits[key] = hit
        return hit

    def index(self, workload: str | None, limit_s: float | None, age_s: float) -> float:
        """The completion index (completions per second at full speed) of a job of this label,
        stopped at ``limit_s`` (``--time``; None: never) once it has run ``age_s``."""
        age = max(0.0, age_s)
        bucket = 0 if age < 60 else int(math.log(age / 60.0) / math.log(1.1)) + 1
        key = (workload or "", limit_s, bucket)
        hit = self._memo.get(key)
        if hit is None:
            lo = 0.0 if bucket == 0 else 60.0 * 1.1 ** (bucket - 1)
            hit = self._memo[key] = gittins(self.dist(workload), limit_s, lo)
        return hit

    def expected_left(self, workload: str | None, limit_s: float | None, age_s: float
                      ) -> float:
        """Mean run time still to go (seconds) after ``age_s``, within ``limit_s``."""
        return expected_left(self.dist(workload), limit_s, age_s)


def _survival_gap(d: LogNormal, limit: float | None, a: float, b: float) -> tuple[float, float]:
    """(P(a < D' <= b), E[min(D', b)] - E[min(D', a)]) for D' = min(D, limit)."""
    top = b if limit is None else min(b, limit)
    done = (1.0 if limit is not None and b >= limit else d.cdf(top)) - d.cdf(a)
    return done, d.served(top) - d.served(a)


def gittins(d: LogNormal, limit_s: float | None, age_s: float) -> float:
    """max over horizons b > age of P(done by b | alive at age) / E[GPU time until b | alive]."""
    a = max(0.0, age_s)
    if limit_s is not None and a >= limit_s:
        return 1.0   # due to stop now: it finishes at once
    base = max(a, 60.0)
    best = 0.0
    horizons = [base * k for k in _STEPS]
    if limit_s is not None:
        horizons = [b for b in horizons if b < limit_s] + [limit_s]
    for b in horizons:
        done, served = _survival_gap(d, limit_s, a, b)
        if served > 0 and done / served > best:
            best = done / served
    return best


def expected_left(d: LogNormal, limit_s: float | None, age_s: float) -> float:
    a = max(0.0, age_s)
    alive = 1.0 - d.cdf(a)
    if limit_s is not None:
        if a >= limit_s:
            return 0.0
        top = d.served(limit_s) - d.served(a)
    else:
        top = math.exp(d.mu + d.sigma ** 2 / 2) - d.served(a)
    return top / alive if alive > 1e-12 else 0.0


@dataclass(frozen=True)
class RuntimeEstimate:
    """How long a job runs in all (seconds from its start): ``seconds`` the median, ``low_s``
    and ``high_s`` the 10% and 90% quantiles, given how long it has already run; ``source``:
    "--time", "user+label history", "user history", "label history", "lab history" (every
    run, neither the user's nor the label's being known), "--time x history" (its --time
    times the user's, else the lab's, learnt ratio of run time to --time, where that spreads
    less than the run times themselves) or "default". With a ``--time`` every figure is capped
    by it and the source says "--time (cap) + ...".
    """

    seconds: float
    low_s: float
    high_s: float
    source: str

    def left_s(self, age_s: float) -> float:
        """Median run time still to go after ``age_s``."""
        return max(0.0, self.seconds - age_s)


def estimate_runtime(durations: Durations | None, *, user: str | None = None,
                     workload: str | None = None, time_limit_s: float | None = None,
                     age_s: float = 0.0) -> RuntimeEstimate:
    """A job's expected run time, pure: from ``durations`` (the lab's finished runs; None: no
    history), its owner and label, its ``--time`` and how long it has run (``age_s``: the
    quantiles are those of run times that got that far). No history: ``DEFAULT_RUNTIME_S``
    as the median within the prior's spread, unless ``--time`` caps it."""
    age = max(0.0, age_s)
    if durations is None:
        d, source = PRIOR, "default"
    else:
        d, source = durations.runtime_dist(user, workload)
    if durations is None or source == "default":
        d = LogNormal(math.log(DEFAULT_RUNTIME_S), PRIOR.sigma)
    if time_limit_s is not None and time_limit_s > 0 and durations is not None:
        # --time x the learnt ratio of run time to --time, where that has the narrower spread
        r = durations.ratio_dist(user)
        if r is not None and r.sigma < d.sigma:
            d, source = LogNormal(math.log(time_limit_s) + r.mu, r.sigma, r.n), RATIO_SOURCE
    low, mid, high = (_quantile_after(d, q, age) for q in (LOW_Q, 0.5, HIGH_Q))
    if time_limit_s is not None and time_limit_s > 0:
        cap = max(time_limit_s, age)
        return RuntimeEstimate(min(mid, cap), min(low, cap), min(high, cap),
                               "--time" if high >= cap else source if source == RATIO_SOURCE
                               else f"--time (cap) + {source}")
    return RuntimeEstimate(mid, low, high, source)


def _quantile_after(d: LogNormal, q: float, age: float) -> float:
    """The ``q`` quantile of run time D given D > age."""
    base = d.cdf(age)
    p = base + q * (1.0 - base)
    if p >= 1.0 - 1e-12:
        return max(age, math.exp(d.mu + 7.0 * d.sigma))
    return max(age, math.exp(d.mu + d.sigma * NormalDist().inv_cdf(p)))


def from_runs(runs: Mapping[str, Iterable[float]]) -> Durations:
    """A ``Durations`` from run times (seconds) per label."""
    return Durations((w, s) for w, secs in runs.items() for s in secs)

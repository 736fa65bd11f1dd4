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
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PRIOR_MEDIAN_S = 3600.0     # no history: run times around an hour ...
PRIOR_SIGMA = 1.5           # ... spread over orders of magnitude (x4.5 per sigma)
PRIOR_WEIGHT = 5.0          # a label's own runs outweigh the lab-wide fit from this many
MIN_RUN_S = 1.0             # shorter run times (a crash at start) count as this long
_STEPS = tuple(1.25 ** k for k in range(1, 48))   # horizons: 25% apart, up to ~45,000 x
_SQRT2 = math.sqrt(2.0)


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
        x = math.log(max(MIN_RUN_S, seconds))
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

    def __init__(self, samples: Iterable[tuple[str | None, float]] = (),
                 prior: LogNormal = PRIOR):
        self.prior = prior
        self._all = _Sums()
        self._by: dict[str, _Sums] = {}
        self._fits: dict[str, LogNormal] = {}
        self._memo: dict[tuple[Any, ...], float] = {}
        for workload, seconds in samples:
            self.add(workload, seconds)

    def add(self, workload: str | None, seconds: float) -> None:
        if not (seconds >= 0 and math.isfinite(seconds)):
            return
        self._all.add(seconds)
        if workload:
            self._by.setdefault(workload, _Sums()).add(seconds)
        self._fits.clear()
        if self._memo:
            self._memo = {}

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


def from_runs(runs: Mapping[str, Iterable[float]]) -> Durations:
    """A ``Durations`` from run times (seconds) per label."""
    return Durations((w, s) for w, secs in runs.items() for s in secs)

"""`iadeep sim` as one core call: load data, build the trace, run every policy, compare.

The predictor for 'iadeep' is ``--model FILE`` or fitted on the given profiles + truth pairs;
the truth is only ever *looked up* (never predicted). To test generalisation, pass a model
trained on other workloads with ``--model`` and truth/profiles that include new workloads.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from ..errors import InputError, NotFoundError
from ..paths import file_problem
from ..settings import FairShare, Policy
from ..text import pyplot, save_plot
from .engine import (
    DEFAULT_POLICIES,
    POLICIES,
    PREEMPT_COST_S,
    PolicyResult,
    SimJob,
    _mem_mib,
    add_phase_shifts,
    generate_jobs,
    make_planner,
    simulate,
)
from .policies import REGISTRY
from .traces import Trace, TraceWindow, assign_workloads, read_trace
from .truth import TruthModel


@dataclass(frozen=True)
class SimSettings:
    jobs: int = 300
    gpus: int = 8
    load: float = 1.2
    seed: int = 0
    multi_gpu_frac: float = 0.1
    gpus_per_node: int = 8
    trace: str | None = None
    profiles: str | None = None      # None: shipped H200 profiles
    truth: str | None = None         # None: shipped H200 pairs (+ shipped triples)
    triples: str | None = None       # None: shipped triples when truth is shipped, else none
    model: str | None = None         # None: fit on profiles + truth
    policies: tuple[str, ...] = DEFAULT_POLICIES
    policy: Policy = field(default_factory=Policy)
    lowo: bool = False               # each job's speeds predicted by a model fitted without it
    # Set: every policy runs twice, without fair share and with it ("<policy>+fs"), and the
    # table shows each user's mean queue wait under both (a trace with a user column).
    fairshare: FairShare | None = None
    # GPU models and counts of a mixed cluster (sim/mixed.parse_gpus: --gpus h200:8,a100:8);
    # empty: ``gpus`` H200s. ``gpus`` is always the total.
    layout: tuple[tuple[str, int], ...] = ()
    phase_shift: float = 0.0         # fraction of jobs that switch workload partway
    # preemption (docs/simulator.md "Preemption"): the fraction of jobs that declared
    # --requeue (plan() with policy.preemption may preempt only those; Tiresias preempts any
    # job, as its paper assumes), and what each preemption costs the preempted job
    requeueable: float = 0.0
    preempt_cost_s: float = PREEMPT_COST_S
    # a part of a real trace (sim/traces.py): start (a date, or days after its first job),
    # length in days, one team (Philly's cluster, Slurm's partition or account), every k-th job
    trace_start: str | None = None
    trace_days: float | None = None
    trace_team: str | None = None
    trace_every: int = 1
    # cold start and labels (sim/coldstart.py): the fraction of jobs of programs never run
    # before, how they are profiled ("alone": as the controller today; "share": while they
    # share, where per-process figures allow), two programs under one label, wrong labels
    new_workloads: float = 0.0
    cold_start: str = "alone"
    coarse_labels: bool = False
    wrong_labels: float = 0.0

    def window(self) -> TraceWindow:
        return TraceWindow(self.trace_start, self.trace_days, self.trace_team, self.trace_every)

    def gpus_text(self) -> str:
        return ",".join(f"{m}:{c}" for m, c in self.layout) if self.layout else str(self.gpus)


@dataclass(frozen=True)
class SimReport:
    settings: SimSettings
    results: tuple[PolicyResult, ...]
    model_note: str
    n_jobs: int
    users: dict[str, tuple[int, float]] = field(default_factory=dict)   # jobs, solo GPU-hours
    mean_duration_s: float = math.nan   # the trace's mean solo duration (run_seeds' bound)
    trace: dict | None = None   # --trace: the real jobs, window and GPUs (Trace.summary)

    def baseline(self) -> PolicyResult | None:
        return next((r for r in self.results if r.name == "exclusive"), None)

    def to_dict(self) -> dict:
        base = self.baseline()
        out = {}
        for r in self.results:
            d = r.to_dict()
            if base is not None and base.avg_jct_s > 0:
                d["avg_jct_vs_exclusive"] = r.avg_jct_s / base.avg_jct_s
                d["p95_jct_vs_exclusive"] = r.p95_jct_s / base.p95_jct_s
                d["makespan_vs_exclusive"] = r.makespan_s / base.makespan_s
            out[r.name] = d
        settings = {k: v for k, v in asdict(self.settings).items() if k != "policy"}
        if self.trace is None:   # the trace options mean nothing for generated jobs
            for k in TRACE_KEYS:
                settings.pop(k, None)
        else:   # the generator's settings mean nothing for a trace: report the trace's own
            for k in GENERATOR_KEYS:
                settings.pop(k, None)
            settings["trace_summary"] = self.trace
        settings["policies"] = list(self.settings.policies)
        settings["policy"] = asdict(self.settings.policy)
        settings["model"] = self.settings.model or "fitted on profiles + truth"
        settings["model_note"] = self.model_note
        settings["jobs_simulated"] = self.n_jobs
        return {"policies": out, "settings": settings}


TRACE_KEYS = ("trace_start", "trace_days", "trace_team", "trace_every")
GENERATOR_KEYS = ("jobs", "load", "multi_gpu_frac")
TOO_BIG = "needs more GPUs than the cluster has"


def _check_path(path: str | None, what: str) -> None:
    problem = file_problem(path) if path is not None else None
    if problem:
        raise NotFoundError(f"{path}: {what} file {problem}", hint=f"check the --{what} path")


def load_inputs(s: SimSettings):
    """Profiles, truth and the predictor the settings name (shipped H200 data by default)."""
    from ..model import data as mp
    if s.lowo and s.model:
        raise InputError("--lowo fits its own models; it cannot be combined with --model",
                         hint="drop --model, or drop --lowo")
    for path, what in ((s.profiles, "profiles"), (s.truth, "truth"), (s.triples, "triples"),
                       (s.model, "model"), (s.trace, "trace")):
        _check_path(path, what)
    profiles = mp.load_profiles_csv(s.profiles) if s.profiles else mp.shipped_profiles()
    pairs = mp.load_pairs_csv(s.truth) if s.truth else mp.shipped_pairs()
    if s.triples:
        triples = mp.load_triples_csv(s.triples)
    else:
        triples = mp.shipped_triples() if s.truth is None else []
    truth = TruthModel(pairs, triples)
    from ..model.predictor import InterferenceModel, fit_model
    if s.lowo:
        return profiles, truth, HeldOutModel(profiles, pairs)
    model = InterferenceModel.load(s.model) if s.model else fit_model(profiles, pairs)
    return profiles, truth, model


class HeldOutModel:
    """Leave-one-workload-out inside the simulator: each job's speed is predicted by a model
    fitted without any pair measurement of its workload's family (``family_of``: the name
    before the first '-'; each shipped H200 workload is its own family), so every job is new to
    the model that judges it, as most of a lab's jobs are. Its partners' other measurements are
    known. ``predict_interval`` comes from the same held-out model (its calibration is the
    inner cross-validation's, so unseen pairs get wide intervals)."""

    def __init__(self, profiles, pairs):
        from ..model.data import family_of
        from ..model.predictor import fit_model
        self.family = {w: family_of(w) for w in profiles}
        self.models = {}
        for fam in sorted(set(self.family.values())):
            members = {w for w, f in self.family.items() if f == fam}
            train = [o for o in pairs if not members & set(o.jobs)]
            self.models[fam] = fit_model(profiles, train)
        n = len(self.models)
        self.note = (f"leave-one-workload-out: {n} models, each fitted without one workload "
                     "family's pairs")

    def _for(self, p):
        from ..model.data import family_of  # a new program's label: its family's model
        return self.models[self.family.get(p.workload) or family_of(p.workload)]

    def predict_group(self, profiles):
        return tuple(float(self._for(p).predict_group(list(profiles))[i])
                     for i, p in enumerate(profiles))

    def predict_interval(self, a, b, level: float = 0.8):
        (lo_a, _), (hi_a, _) = self._for(a).predict_interval(a, b, level)
        (_, lo_b), (_, hi_b) = self._for(b).predict_interval(a, b, level)
        return (lo_a, lo_b), (hi_a, hi_b)


def read_settings_trace(s: SimSettings, profiles) -> Trace:
    """The trace the settings name, cut to their window (read once, then cached)."""
    assert s.trace is not None
    return read_trace(s.trace, profiles, s.window())


def build_trace(s: SimSettings, profiles, truth: TruthModel) -> list[SimJob]:
    usable = sorted(set(profiles) & truth.workloads())   # profiled, and with measured truth
    if s.trace:
        tr = read_settings_trace(s, profiles)
        jobs = list(tr.jobs) if tr.has_workloads else assign_workloads(tr.jobs, usable, s.seed)
        # a job larger than the whole cluster could never start: left out (and counted),
        # never aborting the run; one larger than a node runs as a gang of whole nodes
        jobs = [j for j in jobs if j.gpus <= s.gpus]
    else:
        size: float = s.gpus
        if s.layout:   # load relative to the mixed cluster's H200-equivalent capacity
            from .mixed import capacity
            size = capacity(profiles, usable, s.layout)
        jobs = generate_jobs(usable, s.jobs, size, s.load, s.seed,  # type: ignore[arg-type]
                             s.multi_gpu_frac)
    jobs = add_phase_shifts(jobs, usable, s.phase_shift, s.seed)
    jobs = mark_requeueable(jobs, s.requeueable, s.seed)
    from .coldstart import mark_labels, mark_new_workloads
    jobs = mark_new_workloads(jobs, s.new_workloads, s.seed)
    jobs = mark_labels(jobs, usable, coarse=s.coarse_labels, wrong=s.wrong_labels, seed=s.seed)
    missing = truth.missing_pairs({j.workload for j in jobs}
                                  | {j.phase_to for j in jobs if j.phase_to})
    if missing:
        a, b = missing[0]
        raise InputError(f"the truth data has no measurement for {a} + {b} "
                         f"({len(missing)} pair(s) missing)",
                         hint="add those pairs to --truth PAIRS.csv or drop the workloads")
    return jobs


def mark_requeueable(jobs: Sequence[SimJob], frac: float, seed: int) -> list[SimJob]:
    """``--requeueable F``: that fraction of the jobs (drawn with a random of its own, so the
    trace is the same as without) declared --requeue; 1 is every job, 0 none."""
    if not (math.isfinite(frac) and 0.0 <= frac <= 1.0):
        raise InputError(f"--requeueable must be a fraction between 0 and 1, got {frac:g}",
                         hint="e.g. --requeueable 1 (every job may be preempted)")
    if frac == 0.0:
        return list(jobs)
    import random
    rng = random.Random(f"requeue:{seed}")
    chosen = set(rng.sample([j.id for j in jobs], round(frac * len(jobs))))
    return [replace(j, requeue=j.id in chosen) for j in jobs]


def trace_summary(s: SimSettings, profiles) -> dict | None:
    """What a trace run reports about its trace: real jobs, window, GPUs (None: no trace)."""
    if not s.trace:
        return None
    tr = read_settings_trace(s, profiles)
    kept = Trace(tr.path, tr.format, tuple(j for j in tr.jobs if j.gpus <= s.gpus),
                 tr.has_workloads, tr.start_s, tr.days, tr.start_text, tr.rows,
                 dict(tr.left_out))
    too_big = len(tr.jobs) - len(kept.jobs)
    if too_big:
        kept.left_out[TOO_BIG] = too_big
    out = kept.summary(s.gpus)
    out["cluster_gpus"] = s.gpus
    out["gpus_per_node"] = s.gpus_per_node
    return out


def check_settings(s: SimSettings) -> None:
    for name in s.policies:
        if name not in POLICIES:
            raise InputError(f"unknown policy {name!r}", hint=f"choose from {', '.join(POLICIES)}")
    if not s.policies:
        raise InputError("--policies names no policy", hint=f"e.g. {','.join(DEFAULT_POLICIES)}")
    if s.gpus < 1:
        raise InputError(f"--gpus must be >= 1, got {s.gpus}", hint="e.g. --gpus 8")
    from .coldstart import COLD_START_MODES
    if s.cold_start not in COLD_START_MODES:
        raise InputError(f"--cold-start must be one of {', '.join(COLD_START_MODES)}, got "
                         f"{s.cold_start!r}", hint="e.g. --cold-start share")


def run_sim(s: SimSettings, progress: Callable[[str, int, int], None] | None = None,
            inputs=None) -> SimReport:
    """Run every requested policy on the same trace (``inputs``: load_inputs(s), reused)."""
    check_settings(s)
    profiles, truth, model = inputs if inputs is not None else load_inputs(s)
    jobs = build_trace(s, profiles, truth)
    mem = {j.id: _mem_mib(j, profiles, s.policy) for j in jobs}
    mixed, speeds = None, None
    if s.layout:
        from .mixed import MixedTruth, sim_speeds
        mixed, speeds = MixedTruth(truth, profiles), sim_speeds(profiles, s.layout)
    results = []
    variants = [(name, replace(s.policy, fairshare=None)) for name in s.policies]
    if s.fairshare is not None:
        variants = [v for name, pol in variants
                    for v in ((name, pol), (f"{name}+fs", replace(pol, fairshare=s.fairshare)))]
    for label, base_policy in variants:
        name = label.removesuffix("+fs")
        spec = REGISTRY[name]
        tries = spec.variants(base_policy) if spec.variants else [base_policy]
        best = None
        for pol in tries:
            known, truth_of, learner = _believed(s, profiles, truth, jobs)
            planner = make_planner(name, known, model, truth_of, pol, mem, s.seed, speeds)
            cb = (lambda done, total, _n=label: progress(_n, done, total)) if progress else None
            r = simulate(jobs, planner, truth, gpus=s.gpus, gpus_per_node=s.gpus_per_node,
                         policy=pol, profiles=profiles, name=label, progress=cb,
                         layout=s.layout, mixed=mixed, preempt_cost_s=s.preempt_cost_s,
                         learner=learner)
            if best is None or r.avg_jct_s < best.avg_jct_s:
                best = r
        assert best is not None        # tries is never empty
        results.append(best)
    users: dict[str, tuple[int, float]] = {}
    for j in jobs:
        n, gpu_h = users.get(j.user, (0, 0.0))
        users[j.user] = (n + 1, gpu_h + j.gpus * j.duration_s / 3600.0)
    return SimReport(s, tuple(results), getattr(model, "note", ""), len(jobs),
                     dict(sorted(users.items())),
                     sum(j.duration_s for j in jobs) / len(jobs) if jobs else math.nan,
                     trace_summary(s, profiles))


def _labels(s: SimSettings) -> str:
    """'; new workloads 0.3 (profiled alone)' and the like, for a table's settings line."""
    how = "profiled while sharing" if s.cold_start == "share" else "profiled alone"
    out = f"; new workloads {s.new_workloads:g} ({how})" if s.new_workloads else ""
    out += "; coarse labels" if s.coarse_labels else ""
    return out + (f"; wrong labels {s.wrong_labels:g}" if s.wrong_labels else "")


def _believed(s: SimSettings, profiles, truth: TruthModel, jobs: Sequence[SimJob]):
    """What one policy's run knows: the profiles (a fresh dict, filled in as new programs are
    profiled), the truth asked by label (for the oracle), and the profiler (None: every label
    known, the dict is the shared one)."""
    if not any(j.label for j in jobs):
        return profiles, truth, None
    from .coldstart import LabelledTruth, Profiler, believed_profiles
    known = believed_profiles(profiles, jobs, s.cold_start)
    learner = Profiler(known, profiles, jobs, s.seed, share=s.cold_start == "share")
    return known, LabelledTruth(truth, jobs), learner if learner.todo else None


def format_table(report: SimReport) -> str:
    """The comparison table of the README and docs (hours; ratios against 'exclusive')."""
    base = report.baseline()
    pw = max([10, *(len(r.name) for r in report.results)])   # "exclusive+fs" with --fairshare
    head = (f"{'policy':<{pw}} {'avg JCT':>9} {'p95 JCT':>9} {'makespan':>9} {'GPU busy':>9} "
            f"{'shared':>7} {'impact':>7} {'avg vs excl':>11}")
    lines = [head, "-" * len(head)]
    for r in report.results:
        ratio = f"{r.avg_jct_s / base.avg_jct_s:.2f}x" if base and base.avg_jct_s else "-"
        lines.append(f"{r.name:<{pw}} {r.avg_jct_s / 3600:8.2f}h {r.p95_jct_s / 3600:8.2f}h "
                     f"{r.makespan_s / 3600:8.1f}h {r.gpu_busy:8.0%} {r.shared_frac:7.0%} "
                     f"{r.impact:7.2f} {ratio:>11}")
    s = report.settings
    src = _trace_line(report.trace, s.seed) if report.trace else (
        f"{report.n_jobs} jobs, load {s.load:g}, seed {s.seed}")
    lines.append(f"{src}; {s.gpus_text()} GPUs" + (f"; phase shift {s.phase_shift:g}"
                                                   if s.phase_shift else "") + _labels(s)
                 + f"; model: {report.model_note}")
    lines.append(_preemptions(report))
    lines.append(_verdict(report))
    lines.extend(_user_waits(report))
    return "\n".join(line for line in lines if line)


def _preemptions(report: SimReport) -> str:
    """'preemptions (90 s of work each): tiresias 291 (7.3 GPU-h), iadeep 40 (1.0 GPU-h)'."""
    parts = [f"{r.name} {r.preemptions} ({r.preempt_cost_gpu_h:.1f} GPU-h)"
             for r in report.results if r.preemptions]
    if not parts:
        return ""
    s = report.settings
    who = (f"; iadeep may preempt {s.requeueable:.0%} of the jobs (--requeueable), "
           f"Tiresias any" if s.policy.preemption != "off" else "")
    return (f"preemptions ({s.preempt_cost_s:g} s of work each, --preempt-cost): "
            f"{', '.join(parts)}{who}")


def _trace_line(tr: dict, seed: int) -> str:
    """'trace FILE (philly): 1,044 jobs, 7 days from 2017-10-03 00:00:00, load 1.26,
    workloads drawn (seed 0)' for a run's settings line."""
    start = tr["window_start"]
    when = f"from {start}" if isinstance(start, str) and start else "from its first job"
    drawn = "" if tr["workloads"] == "from the trace" else f", workloads drawn (seed {seed})"
    left = tr.get("left_out") or {}
    out = "; left out: " + ", ".join(f"{n} {why}" for why, n in left.items()) if left else ""
    return (f"trace {tr['path']} ({tr['format']}): {tr['jobs']:,} jobs, "
            f"{tr['window_days']:g} days {when}, load {tr['offered_load']:.2f}{drawn}{out}")


def _user_waits(report: SimReport) -> list[str]:
    """Mean queue wait per user and policy (hours), for a trace with more than one user:
    with --fairshare, each policy without and with fair share side by side."""
    if len(report.users) < 2:
        return []
    names = [r.name for r in report.results]
    width = max([9, *(len(n) for n in names)])
    head = f"{'user':<10} {'jobs':>5} {'GPU-h':>7} " + " ".join(f"{n:>{width}}" for n in names)
    lines = ["", "mean queue wait per user (hours; GPU-h: the user's jobs run alone)", head,
             "-" * len(head)]
    for user, (n, gpu_h) in report.users.items():
        waits = [r.user_waits.get(user) for r in report.results]
        lines.append(f"{user:<10} {n:>5} {gpu_h:>7.1f} " + " ".join(
            f"{'-' if w is None else f'{w / 3600:.2f}':>{width}}" for w in waits))
    return lines


def _verdict(report: SimReport) -> str:
    """One sentence a reader takes away: iadeep against the others, from this run's numbers."""
    by = {r.name: r.avg_jct_s for r in report.results}
    if "iadeep" not in by:
        return ""
    from .policies import is_reference
    parts = [f"{by['iadeep'] / r.avg_jct_s:.2f}x {r.name}" for r in report.results
             if r.name != "iadeep" and not is_reference(r.name) and r.avg_jct_s]
    if by.get("oracle"):
        parts.append(f"{by['iadeep'] / by['oracle'] - 1:+.1%} vs oracle (iadeep's rule with the "
                     f"measured speeds instead of predictions)")
    return "iadeep's average JCT: " + ", ".join(parts) if parts else ""


def plot_jct(report: SimReport, path: str) -> None:
    """JCT distribution per policy (CDF); matplotlib is optional and imported only here."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in report.results:
        xs = sorted(v / 3600 for v in r.jcts)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{r.name} (avg {r.avg_jct_s / 3600:.1f} h)")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"JCT distribution, {report.n_jobs} jobs on {report.settings.gpus} GPUs")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    save_plot(fig, path, dpi=120)


def summary_rows(reports: Sequence[SimReport]) -> list[dict]:
    return [r.to_dict() for r in reports]


# --------------------------------------------------------------------------- many seeds
@dataclass(frozen=True)
class PolicyStats:
    """One policy over N seeds; ratios are to 'exclusive' on the same seed's trace."""

    name: str
    ratio: float           # mean avg-JCT ratio to exclusive
    ratio_ci: float        # half-width of its 95 % confidence interval (Student t)
    p95_h: float           # mean p95 JCT (hours)
    makespan_h: float      # mean makespan (hours)
    impact: float          # mean impact factor
    wins: int              # seeds on which it had the lowest avg JCT of the non-reference ones
    reference: bool        # uses the true speeds (oracle, search): not counted in wins

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SeedReport:
    settings: SimSettings
    label: str                       # e.g. "load 1.2" in a sweep
    seeds: tuple[int, ...]
    stats: tuple[PolicyStats, ...]
    runs: tuple[SimReport, ...]
    model_note: str
    bound_ratio: float               # no-wait lower bound (mean solo duration) / exclusive

    def to_dict(self) -> dict:
        return {"label": self.label, "seeds": list(self.seeds),
                "policies": {p.name: p.to_dict() for p in self.stats},
                "no_wait_bound_ratio": self.bound_ratio, "model": self.model_note}

    def stat(self, name: str) -> PolicyStats | None:
        return next((p for p in self.stats if p.name == name), None)


def winners(report: SimReport) -> set[str]:
    """The non-reference policies with the lowest avg JCT on one seed (ties all win)."""
    from .policies import is_reference
    cands = [r for r in report.results if not is_reference(r.name)]
    if not cands:
        return set()
    best = min(r.avg_jct_s for r in cands)
    return {r.name for r in cands if r.avg_jct_s <= best * (1 + 1e-9)}


def summarize(runs: Sequence[SimReport]) -> tuple[PolicyStats, ...]:
    """Per-policy mean ratio to exclusive with a 95 % CI, mean p95/makespan/impact, wins."""
    from .policies import is_reference, mean_ci
    if not runs:
        return ()
    won: dict[str, int] = {}
    for rep in runs:
        for name in winners(rep):
            won[name] = won.get(name, 0) + 1
    out = []
    for r0 in runs[0].results:
        name = r0.name
        per = [next(r for r in rep.results if r.name == name) for rep in runs]
        ratios = []
        for rep, r in zip(runs, per):
            base = rep.baseline()
            if base is not None and base.avg_jct_s > 0:
                ratios.append(r.avg_jct_s / base.avg_jct_s)
        m, ci = mean_ci(ratios) if ratios else (float("nan"), float("nan"))
        out.append(PolicyStats(name, m, ci,
                               sum(r.p95_jct_s for r in per) / len(per) / 3600,
                               sum(r.makespan_s for r in per) / len(per) / 3600,
                               sum(r.impact for r in per) / len(per), won.get(name, 0),
                               is_reference(name)))
    return tuple(out)


def run_seeds(s: SimSettings, seeds: int, label: str = "", inputs=None,
              progress: Callable[[str, int, int], None] | None = None) -> SeedReport:
    """Run every policy on seeds s.seed .. s.seed+seeds-1 (one trace per seed)."""
    if seeds < 1:
        raise InputError(f"--seeds must be >= 1, got {seeds}", hint="e.g. --seeds 10")
    if "exclusive" not in s.policies:
        raise InputError("--seeds reports ratios to 'exclusive'; include it in --policies",
                         hint=f"e.g. --policies exclusive,{','.join(s.policies)}")
    check_settings(s)
    inputs = inputs if inputs is not None else load_inputs(s)
    if s.trace and read_settings_trace(s, inputs[0]).has_workloads:
        raise InputError("--seeds and --sweep draw new workloads per seed; this trace names "
                         "each job's workload", hint="drop --seeds, or give a trace without "
                         "workloads (Philly's extract, a sacct export)")
    runs, bounds = [], []
    for k in range(seeds):
        rep = run_sim(replace(s, seed=s.seed + k), progress, inputs)
        runs.append(rep)
        base = rep.baseline()
        if base is not None and base.avg_jct_s > 0 and rep.n_jobs:
            bounds.append(rep.mean_duration_s / base.avg_jct_s)
    return SeedReport(s, label, tuple(s.seed + k for k in range(seeds)), summarize(runs),
                      tuple(runs), getattr(inputs[2], "note", ""),
                      sum(bounds) / len(bounds) if bounds else float("nan"))


SWEEP_KEYS = ("load", "gpus")


def parse_sweep(text: str) -> tuple[str, tuple[float, ...]]:
    """``load=0.6,0.9,1.2`` or ``gpus=8,16`` -> (key, values)."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    if not sep or key not in SWEEP_KEYS:
        raise InputError(f"--sweep {text!r}: expected KEY=V1,V2,... with KEY one of "
                         f"{', '.join(SWEEP_KEYS)}", hint="e.g. --sweep load=0.6,0.9,1.2,1.5")
    try:
        values = tuple(float(v) for v in rest.split(",") if v.strip())
    except ValueError:
        raise InputError(f"--sweep {text!r}: values must be numbers",
                         hint="e.g. --sweep load=0.6,0.9,1.2,1.5") from None
    if not values or any(not v > 0 for v in values) or (
            key == "gpus" and any(v != int(v) for v in values)):
        raise InputError(f"--sweep {text!r}: values must be positive"
                         + (" whole numbers" if key == "gpus" else ""),
                         hint="e.g. --sweep gpus=8,16,32")
    return key, values


def run_sweep(s: SimSettings, key: str, values: Sequence[float], seeds: int,
              progress: Callable[[str, int, int], None] | None = None) -> list[SeedReport]:
    check_settings(s)
    if key == "load" and s.trace:
        raise InputError("--sweep load= draws generated jobs; a trace has its own load",
                         hint="sweep gpus= instead (e.g. --sweep gpus=8,16)")
    if key == "gpus" and s.layout:
        raise InputError("--sweep gpus= takes plain GPU counts; it cannot be combined with "
                         f"--gpus {s.gpus_text()}", hint="sweep load= instead, or give --gpus N")
    inputs = load_inputs(s)
    out = []
    for v in values:
        t = replace(s, load=v) if key == "load" else replace(s, gpus=int(v))
        label = f"{key} {v:g}"
        out.append(run_seeds(t, seeds, label, inputs, progress))
    return out


def format_seeds(rep: SeedReport) -> str:
    """One table: each policy's mean avg-JCT ratio to exclusive (95 % CI) and the rest."""
    s = rep.settings
    w = max([10, *(len(p.name) for p in rep.stats)])   # iadeep-blind-model is longer
    head = (f"{'policy':<{w}} {'avg JCT vs excl (95% CI)':>25} {'p95 JCT':>8} {'makespan':>9} "
            f"{'impact':>7} {'wins':>5}")
    lines = []
    title = rep.label or ("workload draws" if s.trace else f"load {s.load:g}")
    n = f"{s.jobs} jobs" if not s.trace else (
        f"{rep.runs[0].n_jobs} jobs of trace {s.trace}" if rep.runs else f"trace {s.trace}")
    lines.append(f"{title}: {len(rep.seeds)} seeds ({rep.seeds[0]}-{rep.seeds[-1]}), "
                 f"{n}, {s.gpus_text()} GPUs"
                 + ("; leave-one-workload-out" if s.lowo else "")
                 + (f"; phase shift {s.phase_shift:g}" if s.phase_shift else "") + _labels(s))
    lines += [head, "-" * len(head)]
    for p in rep.stats:
        ratio = f"{p.ratio:.3f} +- {p.ratio_ci:.3f}"
        wins = "ref" if p.reference else f"{p.wins}"
        lines.append(f"{p.name:<{w}} {ratio:>25} {p.p95_h:7.1f}h {p.makespan_h:8.1f}h "
                     f"{p.impact:7.2f} {wins:>5}")
    lines.append(f"no-wait lower bound (every job starts at once, alone): {rep.bound_ratio:.3f}")
    lines.append(_seeds_verdict(rep))
    return "\n".join(line for line in lines if line)


def _seeds_verdict(rep: SeedReport) -> str:
    me = rep.stat("iadeep")
    if me is None:
        return ""
    others = [p for p in rep.stats if not p.reference and p.name != "iadeep"]
    if not others:
        return ""
    best = min(others, key=lambda p: p.ratio)
    lead = "lowest" if me.ratio < best.ratio else "not the lowest"
    return (f"iadeep's mean ratio is {lead} of the non-reference policies ({me.ratio:.3f}; "
            f"next best {best.name} {best.ratio:.3f}); it won {me.wins} of {len(rep.seeds)} "
            "seeds")


def plot_sweep(reports: Sequence[SeedReport], path: str, key: str | None) -> None:
    """Mean avg-JCT ratio to exclusive with 95 % CI per policy, across the sweep (or bars)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = [p.name for p in reports[0].stats]
    xs = [(r.settings.load if key != "gpus" else r.settings.gpus) for r in reports]
    for i, name in enumerate(names):
        ys = [r.stat(name).ratio for r in reports]          # type: ignore[union-attr]
        es = [r.stat(name).ratio_ci for r in reports]       # type: ignore[union-attr]
        style = "--" if reports[0].stat(name).reference else "-"  # type: ignore[union-attr]
        offs = [x * (1 + 0.003 * (i - len(names) / 2)) for x in xs]  # keep error bars apart
        ax.errorbar(offs, ys, yerr=es, fmt="o" + style, capsize=3, markersize=4, label=name)
    ax.set_xlabel({"gpus": "GPUs", "load": "offered load (1.0 = saturates exclusive)"}.get(
        key or "load", "load"))
    ax.set_ylabel("mean avg JCT / exclusive (95% CI)")
    s = reports[0].settings
    ax.set_title(f"{len(reports[0].seeds)} seeds x {s.jobs} jobs"
                 + ("" if key == "gpus" else f", {s.gpus} GPUs")
                 + (", leave-one-workload-out" if s.lowo else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_plot(fig, path, dpi=90)

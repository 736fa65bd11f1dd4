"""`iadeep sim` as one core call: load data, build the trace, run every policy, compare.

The predictor for 'iadeep' is ``--model FILE`` or fitted on the given profiles + truth pairs;
the truth is only ever *looked up* (never predicted). To test generalisation, pass a model
trained on other workloads with ``--model`` and truth/profiles that include new workloads.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from ..errors import InputError, NotFoundError
from ..inventory import FairShare, Policy
from ..paths import file_problem
from .engine import (
    POLICIES,
    PolicyResult,
    SimJob,
    _mem_mib,
    generate_jobs,
    load_trace,
    make_planner,
    simulate,
)
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
    policies: tuple[str, ...] = POLICIES
    policy: Policy = field(default_factory=Policy)
    # Set: every policy runs twice, without fair share and with it ("<policy>+fs"), and the
    # table shows each user's mean queue wait under both (a trace with a user column).
    fairshare: FairShare | None = None


@dataclass(frozen=True)
class SimReport:
    settings: SimSettings
    results: tuple[PolicyResult, ...]
    model_note: str
    n_jobs: int
    users: dict[str, tuple[int, float]] = field(default_factory=dict)   # jobs, solo GPU-hours

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
        settings["policies"] = list(self.settings.policies)
        settings["policy"] = asdict(self.settings.policy)
        settings["model"] = self.settings.model or "fitted on profiles + truth"
        settings["model_note"] = self.model_note
        settings["jobs_simulated"] = self.n_jobs
        return {"policies": out, "settings": settings}


def _check_path(path: str | None, what: str) -> None:
    problem = file_problem(path) if path is not None else None
    if problem:
        raise NotFoundError(f"{path}: {what} file {problem}", hint=f"check the --{what} path")


def load_inputs(s: SimSettings):
    """Profiles, truth and the predictor the settings name (shipped H200 data by default)."""
    from ..model import data as mp
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
    model = InterferenceModel.load(s.model) if s.model else fit_model(profiles, pairs)
    return profiles, truth, model


def build_trace(s: SimSettings, profiles, truth: TruthModel) -> list[SimJob]:
    if s.trace:
        jobs = load_trace(s.trace, profiles)
    else:
        usable = sorted(set(profiles) & truth.workloads())
        jobs = generate_jobs(usable, s.jobs, s.gpus, s.load, s.seed, s.multi_gpu_frac)
    missing = truth.missing_pairs({j.workload for j in jobs})
    if missing:
        a, b = missing[0]
        raise InputError(f"the truth data has no measurement for {a} + {b} "
                         f"({len(missing)} pair(s) missing)",
                         hint="add those pairs to --truth PAIRS.csv or drop the workloads")
    return jobs


def run_sim(s: SimSettings, progress: Callable[[str, int, int], None] | None = None
            ) -> SimReport:
    """Run every requested policy on the same trace."""
    for name in s.policies:
        if name not in POLICIES:
            raise InputError(f"unknown policy {name!r}", hint=f"choose from {', '.join(POLICIES)}")
    if s.gpus < 1:
        raise InputError(f"--gpus must be >= 1, got {s.gpus}", hint="e.g. --gpus 8")
    profiles, truth, model = load_inputs(s)
    jobs = build_trace(s, profiles, truth)
    mem = {j.id: _mem_mib(j, profiles, s.policy) for j in jobs}
    results = []
    variants = [(name, replace(s.policy, fairshare=None)) for name in s.policies]
    if s.fairshare is not None:
        variants = [v for name, pol in variants
                    for v in ((name, pol), (f"{name}+fs", replace(pol, fairshare=s.fairshare)))]
    for label, pol in variants:
        name = label.removesuffix("+fs")
        planner = make_planner(name, profiles, model, truth, pol, mem, s.seed)
        cb = (lambda done, total, _n=label: progress(_n, done, total)) if progress else None
        results.append(simulate(jobs, planner, truth, gpus=s.gpus,
                                gpus_per_node=s.gpus_per_node, policy=pol,
                                profiles=profiles, name=label, progress=cb))
    users: dict[str, tuple[int, float]] = {}
    for j in jobs:
        n, gpu_h = users.get(j.user, (0, 0.0))
        users[j.user] = (n + 1, gpu_h + j.gpus * j.duration_s / 3600.0)
    return SimReport(s, tuple(results), getattr(model, "note", ""), len(jobs),
                     dict(sorted(users.items())))


def format_table(report: SimReport) -> str:
    """The comparison table the README shows (hours; ratios against 'exclusive')."""
    base = report.baseline()
    pw = max([10, *(len(r.name) for r in report.results)])   # "exclusive+fs" with --fairshare
    head = (f"{'policy':<{pw}} {'avg JCT':>9} {'p95 JCT':>9} {'makespan':>9} {'GPU busy':>9} "
            f"{'shared':>7} {'avg vs excl':>11}")
    lines = [head, "-" * len(head)]
    for r in report.results:
        ratio = f"{r.avg_jct_s / base.avg_jct_s:.2f}x" if base and base.avg_jct_s else "-"
        lines.append(f"{r.name:<{pw}} {r.avg_jct_s / 3600:8.2f}h {r.p95_jct_s / 3600:8.2f}h "
                     f"{r.makespan_s / 3600:8.1f}h {r.gpu_busy:8.0%} {r.shared_frac:7.0%} "
                     f"{ratio:>11}")
    s = report.settings
    src = f"trace {s.trace}" if s.trace else (f"{report.n_jobs} jobs, load {s.load:g}, "
                                            f"seed {s.seed}")
    lines.append(f"{src}; {s.gpus} GPUs; model: {report.model_note}")
    lines.append(_verdict(report))
    lines.extend(_user_waits(report))
    return "\n".join(line for line in lines if line)


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
    parts = [f"{by['iadeep'] / by[name]:.2f}x {name}" for name in ("exclusive", "packing", "random")
             if by.get(name)]
    if by.get("oracle"):
        parts.append(f"{by['iadeep'] / by['oracle'] - 1:+.1%} vs oracle (iadeep's rule with the "
                     f"measured speeds instead of predictions)")
    return "iadeep's average JCT: " + ", ".join(parts) if parts else ""


def plot_jct(report: SimReport, path: str) -> None:
    """JCT distribution per policy (CDF); matplotlib is optional and imported only here."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib, which is not installed",
                         hint="pip install 'iadeep[plot]' (or matplotlib)") from None
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
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise InputError(f"{path}: cannot write plot ({exc.strerror or exc})",
                         hint="choose a writable path for --plot") from None
    finally:
        plt.close(fig)


def summary_rows(reports: Sequence[SimReport]) -> list[dict]:
    return [r.to_dict() for r in reports]

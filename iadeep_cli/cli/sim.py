"""``iadeep sim``: compare placement policies on a simulated lab week (built-in H200 data)."""
from __future__ import annotations

import sys

import typer

from ..errors import InputError
from . import render
from .root import app as main_app


def _progress_printer():
    """Plain ``\\r`` progress lines on stderr, only when a person is watching (a TTY)."""
    if not sys.stderr.isatty():
        return None
    state = {"last": -1}

    def show(policy: str, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct == state["last"] and done != total:
            return
        state["last"] = pct
        bar = "#" * (pct // 5) + "." * (20 - pct // 5)
        end = "\n" if done == total else ""
        sys.stderr.write(f"\r{policy:<10} [{bar}] {done}/{total} jobs{end}")
        sys.stderr.flush()
        if done == total:
            state["last"] = -1
    return show


@main_app.command("sim")
def sim(
    jobs: int = typer.Option(300, "--jobs", "-n", help="Number of jobs to generate."),
    gpus: str | None = typer.Option(None, "--gpus", "-g", help="GPUs in the cluster (nodes of "
                                    "up to 8): a number of H200s, or GPU models and counts, "
                                    "e.g. h200:8,a100:8 (a100: derived from the H200 data, "
                                    "see docs/simulator.md). Default: 8; with --trace-from-db "
                                    "the lab's GPUs as the controller last saw them."),
    load: float = typer.Option(1.2, "--load", help="Arrival rate relative to what the cluster "
                               "serves with one job per GPU (1.0 = saturated)."),
    seed: int = typer.Option(0, "--seed", "-s", help="Random seed (same seed, same result)."),
    multi_gpu: float = typer.Option(0.1, "--multi-gpu", help="Fraction of 2-GPU jobs."),
    trace: str | None = typer.Option(None, "--trace", help="Replay a job trace instead of "
                                     "generated jobs: the simulator's CSV (submit_s,workload,"
                                     "duration_s[,gpus][,user]), the Philly extract "
                                     "(timestamp,duration,num_gpus,gpu_time,cluster; gzip or "
                                     "plain) or a 'sacct --allusers --parsable2' export; told "
                                     "apart by the header. Workloads are drawn per seed where "
                                     "the trace has none."),
    trace_start: str | None = typer.Option(None, "--trace-start", help="With --trace: the "
                                           "window's start, a date (2017-10-03, "
                                           "'2017-10-03 08:00') or days after the trace's "
                                           "first job (14)."),
    trace_days: float | None = typer.Option(None, "--trace-days", help="With --trace: the "
                                            "window's length in days (default: to the end)."),
    trace_team: str | None = typer.Option(None, "--trace-team", help="With --trace: one "
                                          "team's jobs (Philly's cluster column; Slurm's "
                                          "partition or account; else the user)."),
    trace_every: int = typer.Option(1, "--trace-every", help="With --trace: every k-th job "
                                    "of the window (1st, k+1-th, ...)."),
    profiles: str | None = typer.Option(None, "--profiles", help="Workload profiles CSV "
                                        "(default: shipped H200 profiles)."),
    truth: str | None = typer.Option(None, "--truth", help="Measured pairs CSV used as "
                                     "ground truth (default: shipped H200 pairs)."),
    triples: str | None = typer.Option(None, "--triples", help="Measured triples CSV "
                                       "(default: shipped, when --truth is the default)."),
    model: str | None = typer.Option(None, "--model", help="Interference model file "
                                     "(default: fit on --profiles + --truth)."),
    policies: str | None = typer.Option(None, "--policies", help="Comma-separated policies "
                                        "to compare (default: exclusive, packing, random, "
                                        "tiresias, gandiva, lucid, iadeep, oracle; also: "
                                        "search)."),
    seeds: int = typer.Option(1, "--seeds", help="Run this many seeds (from --seed) and print "
                              "mean ratios to exclusive with 95% confidence intervals."),
    sweep: str | None = typer.Option(None, "--sweep", help="One table per setting, e.g. "
                                     "load=0.6,0.9,1.2,1.5 or gpus=8,16 (with --seeds)."),
    lowo: bool = typer.Option(False, "--lowo", help="Leave-one-workload-out: each job's "
                              "speeds predicted by a model fitted without its workload."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: str | None = typer.Option(None, "--plot", help="Write a PNG (needs matplotlib): the "
                                    "JCT distribution of one run, or the ratios with their "
                                    "confidence intervals for --seeds/--sweep."),
    fairshare: bool = typer.Option(False, "--fairshare", help="Also run each policy with "
                                   "fair share (half-life 7 days, weight 10, equal shares) "
                                   "as POLICY+fs; a trace with a user column shows each "
                                   "user's mean wait under both."),
    phase_shift: float = typer.Option(0.0, "--phase-shift", help="Fraction of jobs (0-1) "
                                      "that switch to another workload partway (between 20% "
                                      "and 80% of their work; the true speeds switch too)."),
    new_workloads: float = typer.Option(0.0, "--new-workloads", help="Fraction of jobs (0-1) "
                                        "of programs the lab has never run: no profile until "
                                        "profiled, as the controller does (cold start)."),
    cold_start: str = typer.Option("alone", "--cold-start", help="How a new program is "
                                   "profiled: alone (on an empty GPU, as the controller "
                                   "today) or share (under a provisional profile, while it "
                                   "shares: per-process figures)."),
    coarse_labels: bool = typer.Option(False, "--coarse-labels", help="Two programs under "
                                       "one label (workloads paired in name order; the label "
                                       "has the first one's profile)."),
    wrong_labels: float = typer.Option(0.0, "--wrong-labels", help="Fraction of jobs (0-1) "
                                       "labelled as another workload, drawn at random."),
    preemption: str = typer.Option("off", "--preemption", help="iadeep's lab setting "
                                   "policy.preemption: off, or las (least attained service "
                                   "first; preempts only --requeueable jobs)."),
    requeueable: float = typer.Option(0.0, "--requeueable", help="Fraction of jobs (0-1) "
                                      "that declared --requeue, so plan() may preempt them "
                                      "(Tiresias preempts any job)."),
    preempt_cost: float | None = typer.Option(None, "--preempt-cost", metavar="SECONDS",
                                              help="Work one preemption costs the preempted "
                                              "job (checkpoint, restart, lost progress); "
                                              "default 90, 0 for free preemptions."),
    trace_from_db: bool = typer.Option(False, "--trace-from-db", help="Replay the lab's own "
                                       "jobs (the controller's database; its profiles, "
                                       "measured pairs and model) instead of generated jobs."),
    days: float = typer.Option(14.0, "--days", help="With --trace-from-db: the jobs "
                               "submitted in the last N days."),
    save_trace: str | None = typer.Option(None, "--save-trace", metavar="FILE.csv",
                                          help="Also write the trace simulated as a --trace "
                                          "CSV (submit_s,workload,duration_s,gpus,user)."),
    forecast: bool = typer.Option(False, "--forecast", help="Score forecasts instead: at "
                                  "each submission iadeep's forecast and a Slurm-style one "
                                  "(time limits as run times) against the actual start and "
                                  "end, iadeep policy only (docs/simulator.md)."),
) -> None:
    """Simulate a queue of training jobs under each policy; compare job completion times."""
    from ..inventory import FairShare, Policy
    from ..sim import run as simrun
    from ..sim.mixed import parse_gpus

    if not 0.0 <= multi_gpu <= 1.0:
        raise InputError(f"--multi-gpu must be between 0 and 1, got {multi_gpu}",
                         hint="e.g. --multi-gpu 0.1")
    if not 0.0 <= phase_shift <= 1.0:
        raise InputError(f"--phase-shift must be a fraction between 0 and 1, got {phase_shift:g}",
                         hint="e.g. --phase-shift 0.3 (30% of the jobs change workload)")
    from ..settings import PREEMPTION_RULES
    from ..sim.engine import PREEMPT_COST_S

    if preemption not in PREEMPTION_RULES:
        raise InputError(f"--preemption must be one of {', '.join(PREEMPTION_RULES)}, "
                         f"got {preemption!r}", hint="e.g. --preemption las --requeueable 1")
    if not 0.0 <= requeueable <= 1.0:
        raise InputError(f"--requeueable must be a fraction between 0 and 1, got "
                         f"{requeueable:g}", hint="e.g. --requeueable 1 (every job)")
    if preempt_cost is not None and not 0.0 <= preempt_cost < float("inf"):
        raise InputError(f"--preempt-cost must be seconds >= 0, got {preempt_cost:g}",
                         hint="e.g. --preempt-cost 90 (0: free preemptions)")
    if trace is None and (trace_start is not None or trace_days is not None
                          or trace_team is not None or trace_every != 1):
        raise InputError("--trace-start, --trace-days, --trace-team and --trace-every take "
                         "a part of a trace", hint="add --trace FILE")
    names = (tuple(p.strip() for p in policies.split(",") if p.strip()) if policies is not None
             else simrun.DEFAULT_POLICIES)
    inputs, per_node = None, 8
    if trace_from_db:   # the lab's trace, written where --trace reads it; the lab's inputs
        trace, inputs, (lab_gpus, per_node) = _lab_trace(days, save_trace, trace, profiles,
                                                         truth, triples, model, lowo, seeds,
                                                         sweep)
        gpus = gpus or str(lab_gpus)
    n_gpus, layout = parse_gpus(gpus or "8")
    settings = simrun.SimSettings(jobs=jobs, gpus=n_gpus, layout=layout, load=load, seed=seed,
                                  multi_gpu_frac=multi_gpu, trace=trace, profiles=profiles,
                                  truth=truth, triples=triples, model=model, policies=names,
                                  lowo=lowo, fairshare=FairShare() if fairshare else None,
                                  phase_shift=phase_shift, gpus_per_node=per_node,
                                  policy=Policy(preemption=preemption),
                                  requeueable=requeueable, new_workloads=new_workloads,
                                  cold_start=cold_start, coarse_labels=coarse_labels,
                                  wrong_labels=wrong_labels,
                                  preempt_cost_s=PREEMPT_COST_S if preempt_cost is None
                                  else preempt_cost,
                                  trace_start=trace_start, trace_days=trace_days,
                                  trace_team=trace_team, trace_every=trace_every)
    if forecast:
        if new_workloads or coarse_labels or wrong_labels:
            raise InputError("--forecast scores forecasts with every job's label known; it "
                             "cannot be combined with --new-workloads, --coarse-labels or "
                             "--wrong-labels", hint="drop one of them")
        _forecast(settings, seeds, sweep, as_json, inputs)
        return
    if seeds != 1 or sweep:
        if sweep:
            key, values = simrun.parse_sweep(sweep)
            reports = simrun.run_sweep(settings, key, values, seeds, _progress_printer())
        else:
            key = None
            reports = [simrun.run_seeds(settings, seeds, progress=_progress_printer())]
        if plot:
            simrun.plot_sweep(reports, plot, key)
        if as_json:
            render.as_json({"tables": [r.to_dict() for r in reports]})
        else:
            typer.echo("\n\n".join(simrun.format_seeds(r) for r in reports))
            if plot:
                typer.echo(f"plot written to {plot}")
        return
    if save_trace and not trace_from_db:
        from ..sim.engine import write_trace
        write_trace(simrun.build_trace(settings, *simrun.load_inputs(settings)[:2]), save_trace)
    report = simrun.run_sim(settings, progress=_progress_printer(), inputs=inputs)
    if plot:
        simrun.plot_jct(report, plot)
    if as_json:
        render.as_json(report.to_dict())
    else:
        typer.echo(simrun.format_table(report))
        if plot:
            typer.echo(f"plot written to {plot}")


def _lab_trace(days: float, save: str | None, trace, profiles, truth, triples, model, lowo,
               seeds: int, sweep) -> tuple[str, tuple, tuple[int, int]]:
    """(the trace CSV, (profiles, truth, model), the lab's GPUs and GPUs of its largest
    node) for --trace-from-db."""
    import atexit
    import os
    import tempfile
    import time

    from ..sim import whatif
    from ..sim.engine import write_trace
    from .report import open_database

    clash = [name for name, given in (("--trace", trace), ("--profiles", profiles),
                                      ("--truth", truth), ("--triples", triples),
                                      ("--model", model), ("--lowo", lowo),
                                      ("--seeds", seeds != 1), ("--sweep", sweep)) if given]
    if clash:
        raise InputError(f"--trace-from-db replays the lab's jobs with the lab's profiles, "
                         f"pairs and model; it cannot be combined with {clash[0]}",
                         hint=f"drop {clash[0]}")
    if not 0 < days <= 365:
        raise InputError(f"--days must be in (0, 365], got {days:g}", hint="e.g. --days 14")
    store = open_database("sim --trace-from-db")
    try:
        now = time.time()
        known = whatif.known_profiles(store)
        with store.read() as conn:
            found = whatif.lab_trace(conn, now - days * whatif.DAY_S, now, known)
            n_gpus, per_node = whatif.layout(conn)
        if not found.jobs:
            raise InputError(f"no job of the last {days:g} days can be replayed "
                             f"({found.note()})", hint="try a longer --days")
        inputs = whatif.lab_inputs(store, store.path.with_name("interference-model.json"),
                                   {j.workload for j in found.jobs})
    finally:
        store.close()
    if save:
        path = save
    else:   # removed when the command ends
        fd, path = tempfile.mkstemp(prefix="iadeep-trace-", suffix=".csv")
        os.close(fd)
        atexit.register(os.unlink, path)
    write_trace(found.jobs, path)
    return path, inputs, (n_gpus, per_node) if n_gpus > 0 else (8, 8)


def _forecast(settings, seeds: int, sweep: str | None, as_json: bool, inputs) -> None:
    """``iadeep sim --forecast``: forecast accuracy, per load of a --sweep load=... ."""
    from dataclasses import replace

    from ..sim import foresee, run as simrun

    loads = [settings.load]
    if sweep:
        key, values = simrun.parse_sweep(sweep)
        if key != "load":
            raise InputError(f"--forecast sweeps only the load, got --sweep {key}=...",
                             hint="e.g. --forecast --sweep load=0.9,1.2,1.5")
        loads = [float(v) for v in values]
    say = (lambda line: None) if as_json else \
        (lambda line: print(line, file=sys.stderr, flush=True))
    reports = [foresee.forecast_report(replace(settings, load=v), seeds, say, inputs)
               for v in loads]
    if as_json:
        render.as_json({"forecast": [r.to_dict() for r in reports]})
    else:
        typer.echo("\n\n".join(foresee.format_report(r) for r in reports))

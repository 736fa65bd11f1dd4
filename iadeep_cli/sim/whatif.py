"""What-if: the lab's own recent history replayed in the simulator under candidate settings.

The trace comes from the controller's database (``lab_trace``): every job submitted in the
window that ran to an end (the newest ``MAX_REPLAY_JOBS`` of them: a simulation's cost grows
about quadratically with its jobs, 9.6 / 147 / 639 s for 1,000 / 5,000 / 10,000, so a busy
lab's whole window would never finish), at the time it was submitted, with its workload label,
its GPUs, its owner and its *solo* run time (the exclusive-GPU work the controller accounted for it,
``work_s``, per GPU; its wall time where nothing was accounted). Jobs whose workload has no
profile, and jobs not ended yet, are left out and counted.

The truth the replay runs on is the lab's: the shipped H200 pairs and triples, the pairs this
lab measured (they replace a shipped pair of the same workloads), and for a pair measured
nowhere the model's own prediction (so an unmeasured pair is judged as placement would judge
it: that is what the replay cannot know better).

Candidates are plan() settings (``TUNABLE``): jobs per GPU, the speed floor and the sharing
rule. A key the lab pinned in nodes.yaml keeps its value in every candidate. Each candidate is
one full simulation of the trace with the iadeep policy (the controller's planner, its
run-time adaptation included); the table gives each one's average and p95 JCT and wait.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sqlite3
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..inventory import TUNABLE_KEYS as TUNABLE
from ..paths import replace_file
from ..profiles import CoLocation, Profile
from ..settings import AdaptPolicy, Policy
from ..text import settings_label as label
from .engine import SimJob, _mem_mib, make_planner, simulate
from .truth import TruthModel

log = logging.getLogger("iadeep.sim")
NICE = 10   # the controller's replay child runs at this priority (as the model's refit)
# plan() settings self-tuning may change (inventory.TUNABLE_KEYS), each with the values it tries
GRID: dict[str, tuple] = {"max_jobs_per_gpu": (1, 2, 3), "min_speed": (0.3, 0.5),
                          "sharing": ("threshold", "jct")}
RAN = ("succeeded", "failed", "timeout", "cancelled")   # states a job that ran can end in
DAY_S = 86400.0
MAX_REPLAY_JOBS = 2000   # the newest jobs of the window replayed; older ones are left out


def settings_of(policy: Policy) -> dict:
    """The tunable settings of a policy, as a plain dict (JSON, tables)."""
    return {k: getattr(policy, k) for k in TUNABLE}


def candidates(base: Policy) -> list[Policy]:
    """Every grid point, the pinned keys held at ``base``'s value, plus ``base`` itself; one
    job per GPU is one candidate (floor and rule do not matter when nothing shares)."""
    pinned = set(base.pinned)
    axes = {k: ((getattr(base, k),) if k in pinned else GRID[k]) for k in TUNABLE}
    out: list[Policy] = [base]
    seen = {_key(base)}
    for k in axes["max_jobs_per_gpu"]:
        for f in axes["min_speed"]:
            for rule in axes["sharing"]:
                pol = replace(base, max_jobs_per_gpu=k, min_speed=f, sharing=rule)
                if _key(pol) not in seen:
                    seen.add(_key(pol))
                    out.append(pol)
    return out


def _key(policy: Policy) -> tuple:
    s = settings_of(policy)
    return (1,) if s["max_jobs_per_gpu"] == 1 else tuple(s.values())


# --------------------------------------------------------------------------- the trace
@dataclass(frozen=True)
class LabTrace:
    jobs: tuple[SimJob, ...]
    since: float
    until: float
    left_out: dict[str, int]   # reason -> jobs

    def note(self) -> str:
        out = f"{len(self.jobs)} jobs"
        if self.left_out:
            out += " (left out: " + ", ".join(f"{n} {why}" for why, n in
                                              sorted(self.left_out.items())) + ")"
        return out


def lab_trace(conn: sqlite3.Connection, since: float, until: float,
              known: Mapping[str, Profile], max_jobs: int | None = None) -> LabTrace:
    """The jobs submitted in ``[since, until]`` that ran to an end, as a simulator trace
    (submit times from the first one's); only the newest ``max_jobs`` of them if given (the
    others are counted as left out)."""
    rows = conn.execute(
        "SELECT id, owner, workload, gpus, state, submitted_at, started_at, ended_at, work_s "
        "FROM jobs WHERE submitted_at >= ? AND submitted_at <= ? ORDER BY submitted_at, id",
        (since, until)).fetchall()
    left: dict[str, int] = {}
    kept = []
    for r in rows:
        if r["started_at"] is None or r["ended_at"] is None or r["state"] not in RAN:
            why = "not ended yet" if r["ended_at"] is None else "never started"
            left[why] = left.get(why, 0) + 1
            continue
        if not r["workload"] or r["workload"] not in known:
            left["without a profiled workload"] = left.get("without a profiled workload", 0) + 1
            continue
        gpus = max(1, int(r["gpus"] or 1))
        work = float(r["work_s"] or 0.0) / gpus
        wall = max(0.0, float(r["ended_at"]) - float(r["started_at"]))
        solo = work if work > 0 else wall
        if solo <= 0:
            left["with no run time"] = left.get("with no run time", 0) + 1
            continue
        kept.append((float(r["submitted_at"]), r["workload"], solo, gpus, r["owner"]))
    if max_jobs is not None and len(kept) > max_jobs:
        left[f"older than the newest {max_jobs}"] = len(kept) - max_jobs
        kept = kept[len(kept) - max_jobs:]
    t0 = kept[0][0] if kept else since
    jobs = tuple(SimJob(i + 1, round(s - t0, 3), w, round(d, 3), g, u)
                 for i, (s, w, d, g, u) in enumerate(kept))
    return LabTrace(jobs, since, until, left)


def lab_truth(profiles: Mapping[str, Profile], pairs: Sequence[CoLocation],
              lab_pairs: Sequence[CoLocation], triples: Sequence[CoLocation], model,
              workloads: set[str]) -> TruthModel:
    """Shipped pairs, the lab's (they replace a shipped one of the same two workloads), and
    the model's prediction for every pair among ``workloads`` measured nowhere."""
    by_pair = {tuple(sorted(o.jobs)): o for o in pairs}
    by_pair.update({tuple(sorted(o.jobs)): o for o in lab_pairs})
    names = sorted(w for w in workloads if w in profiles)
    for i, a in enumerate(names):
        for b in names[i:]:
            if (a, b) not in by_pair:
                sa, sb = (float(x) for x in model.predict_group([profiles[a], profiles[b]]))
                by_pair[(a, b)] = CoLocation("model", (a, b), (sa, sb))
    return TruthModel(by_pair.values(), triples)


# --------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Outcome:
    settings: dict
    avg_jct_s: float
    p95_jct_s: float
    avg_wait_s: float
    p95_wait_s: float

    def to_dict(self) -> dict:
        return {"settings": self.settings, "label": label(self.settings),
                "avg_jct_s": self.avg_jct_s, "p95_jct_s": self.p95_jct_s,
                "avg_wait_s": self.avg_wait_s, "p95_wait_s": self.p95_wait_s}


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def what_if(jobs: Sequence[SimJob], tries: Sequence[Policy], profiles: Mapping[str, Profile],
            truth: TruthModel, model, gpus: int, gpus_per_node: int,
            progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """One simulation of ``jobs`` per candidate (the iadeep policy; seed 0)."""
    out = []
    for n, pol in enumerate(tries):
        mem = {j.id: _mem_mib(j, profiles, pol) for j in jobs}
        planner = make_planner("iadeep", profiles, model, truth, pol, mem, 0)
        r = simulate(jobs, planner, truth, gpus=gpus, gpus_per_node=gpus_per_node,
                     policy=pol, profiles=profiles, name="iadeep")
        out.append(Outcome(settings_of(pol), r.avg_jct_s, r.p95_jct_s, r.avg_wait_s,
                           p95(r.waits)))
        if progress is not None:
            progress(n + 1, len(tries))
    return out


def best(outcomes: Sequence[Outcome]) -> Outcome:
    """The lowest average JCT (p95 JCT breaks a tie, then the order tried)."""
    return min(outcomes, key=lambda o: (round(o.avg_jct_s, 6), round(o.p95_jct_s, 6)))


# --------------------------------------------------------------------------- one replay
def policy_from_json(data: dict) -> Policy:
    """A Policy from ``dataclasses.asdict`` of one (fair share left out)."""
    data = dict(data)
    data["adapt"] = AdaptPolicy(**data.get("adapt", {}))
    data["pinned"] = tuple(data.get("pinned", ()))
    data["fairshare"] = None
    names = {f.name for f in dataclasses.fields(Policy)}
    return Policy(**{k: v for k, v in data.items() if k in names})


def layout(conn: sqlite3.Connection) -> tuple[int, int]:
    """(GPUs, GPUs of the largest node) as the controller last saw the lab's nodes."""
    from ..store import cluster

    counts = [len(n.gpus) for n, _ in cluster.load_nodes(conn) if n.gpus]
    return (sum(counts), max(counts)) if counts else (0, 0)


def replay(store, policy: Policy, days: float, now: float, model_file: Path | None = None,
           progress: Callable[[int, int], None] | None = None,
           max_jobs: int = MAX_REPLAY_JOBS) -> dict:
    """The what-if table of the jobs submitted in the last ``days`` (the newest ``max_jobs``
    of them) as plain data: the trace, each candidate's outcome, the settings in force
    (``policy``'s) and the best one."""
    from ..model.data import shipped_pairs, shipped_profiles, shipped_triples
    from ..store import profiles as profrows

    with store.read() as conn:
        lab_profiles = {p.workload: p for p, _, _ in profrows.load_profiles(conn)}
        lab_pairs = [c for c in profrows.load_colocations(conn) if len(c.jobs) == 2]
        profiles = {**shipped_profiles(), **lab_profiles}
        trace = lab_trace(conn, now - days * DAY_S, now, profiles, max_jobs)
        gpus, per_node = layout(conn)
    out: dict[str, Any] = {"at": now, "days": days, "since": trace.since,
                           "jobs": len(trace.jobs), "trace": trace.note(), "gpus": gpus,
                           "in_force": settings_of(policy), "pinned": list(policy.pinned),
                           "outcomes": []}
    if not trace.jobs or gpus < 1:
        out["note"] = "no GPUs seen yet" if gpus < 1 else "no finished jobs in the window"
        return out
    model = _model(model_file, lab_profiles, lab_pairs)
    truth = lab_truth(profiles, shipped_pairs(), lab_pairs, shipped_triples(), model,
                      {j.workload for j in trace.jobs})
    outcomes = what_if(trace.jobs, candidates(policy), profiles, truth, model, gpus, per_node,
                       progress)
    out["outcomes"] = [o.to_dict() for o in outcomes]
    out["best"] = best(outcomes).settings
    return out


def known_profiles(store) -> dict[str, Profile]:
    """Every profile: shipped, overridden by the lab's."""
    from ..model.data import shipped_profiles
    from ..store import profiles as profrows

    with store.read() as conn:
        return {**shipped_profiles(), **{p.workload: p for p, _, _ in
                                         profrows.load_profiles(conn)}}


def lab_inputs(store, model_file: Path | None, workloads: set[str]):
    """(profiles, truth, model) of the lab, for `iadeep sim --trace-from-db`."""
    from ..model.data import shipped_pairs, shipped_profiles, shipped_triples
    from ..store import profiles as profrows

    with store.read() as conn:
        lab_profiles = {p.workload: p for p, _, _ in profrows.load_profiles(conn)}
        lab_pairs = [c for c in profrows.load_colocations(conn) if len(c.jobs) == 2]
    profiles = {**shipped_profiles(), **lab_profiles}
    model = _model(model_file, lab_profiles, lab_pairs)
    truth = lab_truth(profiles, shipped_pairs(), lab_pairs, shipped_triples(), model,
                      workloads)
    return profiles, truth, model


def _model(path: Path | None, lab_profiles, lab_pairs):
    """The controller's fitted model (its refit's file), else one fitted here."""
    from ..model.data import shipped_pairs, shipped_profiles
    from ..model.predictor import InterferenceModel, fit_model

    if path is not None and path.exists():
        try:
            return InterferenceModel.load(path)
        except Exception:   # an unreadable file: fit anew rather than stop
            log.warning("cannot read %s; fitting the model for the replay", path)
    return fit_model(shipped_profiles(), shipped_pairs(), extra_profiles=lab_profiles,
                     extra_observations=lab_pairs)


def main(argv: list[str] | None = None) -> int:
    """``python -m iadeep_cli.sim.whatif``: the controller's replay, in a child process at low
    priority; writes the table to --out (atomically) and its CPU seconds on stderr."""
    ap = argparse.ArgumentParser(prog="iadeep-whatif")
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--days", type=float, required=True)
    ap.add_argument("--now", type=float, required=True)
    ap.add_argument("--policy", required=True)
    args = ap.parse_args(argv)
    try:
        os.nice(NICE)
    except OSError:
        pass
    from ..store import Store

    store = Store(args.db, readonly=True)
    try:
        table = replay(store, policy_from_json(json.loads(args.policy)), args.days, args.now,
                       args.db.with_name("interference-model.json"))
    finally:
        store.close()
    usage = os.times()
    table["cpu_s"] = round(usage.user + usage.system + usage.children_user, 2)
    replace_file(args.out, json.dumps(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

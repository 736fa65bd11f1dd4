"""`iadeep model fit|predict|eval`: the interference model from the command line.

`predict` with --model loads a JSON model and predicts with numpy only (no scipy import),
so predicting 10,000 pairs takes well under 2 s as a whole process.
"""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from . import render

app = typer.Typer(help="Fit, evaluate and query the pairwise interference model.",
                  no_args_is_help=True)

PROFILES_HELP = "profiles CSV (default: the shipped H200 data)"
PAIRS_HELP = "pairs CSV of measured co-location speeds (default: the shipped H200 data)"


def _profiles(path: Path | None):
    from ..model.data import load_profiles_csv, shipped_profiles
    return shipped_profiles() if path is None else load_profiles_csv(path)


def _pairs(path: Path | None):
    from ..model.data import load_pairs_csv, shipped_pairs
    return shipped_pairs() if path is None else load_pairs_csv(path)


@app.command("fit")
def fit(profiles: Path | None = typer.Option(None, "--profiles", help=PROFILES_HELP),
        pairs: Path | None = typer.Option(None, "--pairs", help=PAIRS_HELP),
        output: Path = typer.Option(..., "-o", "--output", help="model file to write (JSON)"),
        ) -> None:
    """Fit the predictor on measured pairs and save it.

    Without --profiles/--pairs: the shipped H200 data plus this lab's own measurements from
    the state database, which take precedence."""
    from ..controller.catalog import lab_measurements
    from ..model.predictor import fit_model
    lab_profiles, lab_pairs = lab_measurements() if profiles is None and pairs is None else ({}, [])
    model = fit_model(_profiles(profiles), _pairs(pairs), extra_profiles=lab_profiles,
                      extra_observations=lab_pairs)
    model.save(output)
    if model.is_analytic:
        print(f"Warning: {model.note}", file=sys.stderr)
    print(f"wrote {output}: {model.note}")


@app.command("predict")
def predict(pairs: Path = typer.Option(..., "--pairs", help="query CSV with columns job_a,job_b"),
            profiles: Path | None = typer.Option(None, "--profiles", help=PROFILES_HELP),
            model: Path | None = typer.Option(None, "--model",
                                              help="model file (default: fit on shipped data)"),
            ) -> None:
    """Print predicted speeds as CSV (job_a,job_b,speed_a,speed_b), one row per query row."""
    from ..model.data import load_query_csv
    from ..model.predictor import InterferenceModel, default_model, gpu_mismatch
    profs = _profiles(profiles)
    query = load_query_csv(pairs, profs)
    m = InterferenceModel.load(model) if model is not None else default_model()
    warning = gpu_mismatch(m, profs)
    if warning:
        print(f"Warning: {warning}", file=sys.stderr)
    speeds = m.predict_many([(profs[a], profs[b]) for a, b in query])
    lines = ["job_a,job_b,speed_a,speed_b"]
    lines += [f"{a},{b},{sa:.4f},{sb:.4f}" for (a, b), (sa, sb) in zip(query, speeds.tolist())]
    sys.stdout.write("\n".join(lines) + "\n")


@app.command("eval")
def evaluate(profiles: Path | None = typer.Option(None, "--profiles", help=PROFILES_HELP),
             pairs: Path | None = typer.Option(None, "--pairs", help=PAIRS_HELP),
             level: float = typer.Option(0.8, "--level", min=0.5, max=0.99,
                                         help="interval level whose coverage is reported"),
             as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
             ) -> None:
    """Held-out MAE of the predictor beside the constant, analytic and utilisation-sum rules,
    per GPU model:
    leave-one-workload-out, and leave-one-family-out when workloads carry families (a `family`
    column or names `family-...`), with the coverage of the model's intervals."""
    from ..model.data import load_families_csv
    from ..model.evaluate import evaluate_all
    families = load_families_csv(profiles) if profiles is not None else None
    results = evaluate_all(_profiles(profiles), _pairs(pairs), families, level=level)
    if as_json:
        render.as_json({"results": [r.to_dict() for r in results]})
        return
    for i, res in enumerate(results):
        if i:
            print()
        unit = "workloads" if res.protocol == "leave-one-workload-out" else "families"
        print(f"{res.gpu_model or 'unknown GPU'}: {res.protocol} over {res.n_groups} {unit} "
              f"({res.n_workloads} workloads), {res.n_predictions} held-out speeds")
        print(f"{'method':<34}{'MAE':>8}")
        for name, v in (("model", res.mae_model),
                        ("baseline: constant (training mean)", res.mae_mean_baseline),
                        ("baseline: analytic prior", res.mae_analytic_prior),
                        ("baseline: utilisation sum", res.mae_util_sum_baseline)):
            print(f"{name:<34}{v:>8.4f}")
        print(f"{res.interval_level:.0%} intervals cover {res.coverage:.1%} of held-out speeds "
              f"(mean width {res.mean_interval_width:.3f})")
        print(f"fit: {res.fit_s:.2f} s per fold (mean of {res.n_groups})")

"""Nested held-out evaluation of the interference model's structural variants: every choice
among them is made inside each outer fold, by the same protocol run on that fold's training
pairs only, so the outer error is an honest estimate of "fit, choosing the variant" (a variant
picked by looking at the held-out scores themselves reports an optimistic figure).

Variants (the first wins ties):

* ``rule first``: the model as shipped: the one-standard-error rule of the fit's inner
  cross-validation takes the base rule itself as the simplest prior, then the rule times one
  fitted factor (the scaled rule);
* ``scaled rule first``: the scaled rule taken as the simplest (``fit_model(...,
  scaled_first=True)``).

Both use the correction on the log-speed scale (chosen by this script over the additive one
at commit 7bc9913) and consider the scaled rule (chosen over the model before it at commit
8fc976c). (Each known workload's offset as the partner was rejected by this script at that
commit and its code removed since: docs/scheduling.md has its figures.)

For each data set it prints every variant alone (no choice: ``model eval``'s figure for that
variant) and the nested choice among them, with the variant each outer fold chose.
Leave-one-family-out where workloads carry families, else leave-one-workload-out.

    PYTHONPATH=. .venv/bin/python benchmarks/nested_eval.py            # H200 + lucid-part
    PYTHONPATH=. .venv/bin/python benchmarks/nested_eval.py --profiles P.csv --pairs Q.csv
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def variants():
    from iadeep_cli.model.predictor import fit_model

    def with_options(**options):
        return lambda groups: (lambda p, o: fit_model(p, o, groups=groups, **options))
    return {"rule first": with_options(scaled_first=False),
            "scaled rule first": with_options(scaled_first=True)}


def run(label: str, profiles_csv: Path, pairs_csv: Path) -> None:
    from iadeep_cli.model.data import family_of, load_pairs_csv, load_profiles_csv
    from iadeep_cli.model.evaluate import LOFO, LOWO, families_usable, nested_cross_validate

    profiles, pairs = load_profiles_csv(profiles_csv), load_pairs_csv(pairs_csv)
    workloads = sorted({j for o in pairs for j in o.jobs if j in profiles})
    fams = {w: family_of(w) for w in workloads}
    protocol, groups = (LOFO, fams) if families_usable(fams, workloads) else (LOWO, {})
    all_v = variants()
    print(f"\n{label}: {protocol}, {len(workloads)} workloads, {len(pairs)} pairs")
    print(f"{'variant(s)':<32} {'MAE':>7} {'util sum':>8} {'80% cov':>7} {'time':>6}  chosen")
    names = list(all_v)
    for chosen in [[n] for n in names] + [names]:
        t0 = time.perf_counter()
        res = nested_cross_validate(profiles, pairs, groups, {n: all_v[n] for n in chosen},
                                    protocol=protocol)
        r = res.outer
        picks = ("" if len(chosen) == 1 else
                 "; ".join(f"{g}: {v}" for g, v in sorted(res.chosen.items())))
        name = chosen[0] if len(chosen) == 1 else f"nested: choose among {len(chosen)}"
        print(f"{name:<32} {r.mae_model:7.4f} {r.mae_util_sum_baseline:8.4f} "
              f"{100 * r.coverage:6.1f}% {time.perf_counter() - t0:5.0f}s  {picks}")
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path)
    ap.add_argument("--pairs", type=Path)
    ap.add_argument("--lucid", type=Path, default=SHARED / "lucid-part",
                    help="the lucid-part folder (default: ../shared/data/lucid-part)")
    a = ap.parse_args()
    if a.profiles or a.pairs:
        if not (a.profiles and a.pairs):
            ap.error("--profiles and --pairs go together")
        run(str(a.pairs), a.profiles, a.pairs)
        return
    run("shipped H200", ROOT / "iadeep_cli" / "data" / "h200" / "profiles.csv",
        ROOT / "iadeep_cli" / "data" / "h200" / "pairs.csv")
    lucid = a.lucid
    if (lucid / "pairs.csv").exists():
        run("lucid-part", lucid / "profiles.csv", lucid / "pairs.csv")
    else:
        print(f"\nlucid-part: no pairs.csv in {lucid}, skipped (give its folder with --lucid)")


if __name__ == "__main__":
    main()

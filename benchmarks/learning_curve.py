"""The learning curve of the interference model: its error on a new workload after its first
1, 3 and 10 observed pairs (``model/evaluate.learning_curve``), beside the utilisation-sum
rule on the same held-out speeds.

Held-out protocol: every pair touching the new workload (H200: each of the 7 workloads in turn)
or family (lucid-part: each of its 5 families in turn) is held out; k of them, drawn at random
(5 draws), are added to the training pairs as the lab's first measurements; the rest are
scored, the same ones for every k of a draw. Each fit chooses its own setting on its own
training pairs, as ``model eval``'s folds do.

    PYTHONPATH=. .venv/bin/python benchmarks/learning_curve.py [--draws 5] [--ks 0,1,3,10]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def run(label: str, profiles_csv: Path, pairs_csv: Path, ks: list[int], draws: int) -> None:
    from iadeep_cli.model.data import family_of, load_pairs_csv, load_profiles_csv
    from iadeep_cli.model.evaluate import LOFO, LOWO, families_usable, learning_curve

    profiles, pairs = load_profiles_csv(profiles_csv), load_pairs_csv(pairs_csv)
    workloads = sorted({j for o in pairs for j in o.jobs if j in profiles})
    fams = {w: family_of(w) for w in workloads}
    protocol, groups = (LOFO, fams) if families_usable(fams, workloads) else (LOWO, {})
    t0 = time.perf_counter()
    points = learning_curve(profiles, pairs, groups, ks, draws=draws)
    print(f"\n{label}: {protocol}, {len(workloads)} workloads, {len(pairs)} pairs, "
          f"{draws} draws ({time.perf_counter() - t0:.0f} s)")
    print(f"{'observed pairs':>14} {'model MAE':>9} {'util sum':>8} {'speeds':>6} {'groups':>6}")
    for p in points:
        print(f"{p.k:>14} {p.mae_model:9.4f} {p.mae_util_sum:8.4f} {p.n_predictions:>6} "
              f"{p.n_groups:>6}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--ks", default="0,1,3,10")
    ap.add_argument("--only", choices=("h200", "lucid"))
    ap.add_argument("--lucid", type=Path, default=SHARED / "lucid-part",
                    help="the lucid-part folder (default: ../shared/data/lucid-part)")
    a = ap.parse_args()
    ks = [int(k) for k in a.ks.split(",")]
    if a.only != "lucid":
        run("shipped H200", ROOT / "iadeep_cli" / "data" / "h200" / "profiles.csv",
            ROOT / "iadeep_cli" / "data" / "h200" / "pairs.csv", ks, a.draws)
    lucid = a.lucid
    if a.only != "h200":
        if not (lucid / "pairs.csv").exists():
            ap.error(f"{lucid}: no pairs.csv there (give --lucid DIR)")
        run("lucid-part", lucid / "profiles.csv", lucid / "pairs.csv", ks, a.draws)


if __name__ == "__main__":
    main()

"""Time the whole `iadeep model predict` process on 10,000 query rows against a bare
`python -c "import numpy"` started the same way, in the same run (medians of several runs).

    .venv/bin/python benchmarks/bench_predict.py [--runs 5] [--rows 10000]
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", type=int, default=10_000)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from iadeep_cli.model.data import shipped_pairs, shipped_profiles
    from iadeep_cli.model.predictor import fit_model

    names = sorted(shipped_profiles())
    iadeep = str(Path(sys.executable).with_name("iadeep"))
    with tempfile.TemporaryDirectory() as tmp:
        model, query = Path(tmp, "model.json"), Path(tmp, "query.csv")
        fit_model(shipped_profiles(), shipped_pairs()).save(model)
        rng = random.Random(0)
        query.write_text("job_a,job_b\n" + "".join(
            f"{rng.choice(names)},{rng.choice(names)}\n" for _ in range(args.rows)))
        predict = [iadeep, "model", "predict", "--model", str(model), "--pairs", str(query)]
        baseline = [sys.executable, "-c", "import numpy"]
        timed(predict), timed(baseline)  # warm the file cache
        p, b = [], []
        for _ in range(args.runs):
            p.append(timed(predict))
            b.append(timed(baseline))
    mp, mb = statistics.median(p), statistics.median(b)
    print(f"iadeep model predict, {args.rows} rows: median {mp:.3f} s over {args.runs} runs")
    print(f"python -c 'import numpy'          : median {mb:.3f} s over {args.runs} runs")
    print(f"ratio predict / baseline          : {mp / mb:.2f}")


if __name__ == "__main__":
    main()

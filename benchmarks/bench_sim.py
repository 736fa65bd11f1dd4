"""`iadeep sim --jobs 2000` end to end (target: under 60 s).

Times the default comparison (8 policies: the baselines, the peers, iadeep, oracle) and, as a
same-run baseline, the 'exclusive' policy alone on the same settings; prints both and the ratio.
Run: .venv/bin/python benchmarks/bench_sim.py
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

IADEEP = str(Path(sys.executable).parent / "iadeep")


def timed(*args: str) -> float:
    t = time.perf_counter()
    subprocess.run([IADEEP, "sim", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    full = timed("--jobs", "2000")
    base = timed("--jobs", "2000", "--policies", "exclusive")
    print("iadeep sim --jobs 2000 (8 default policies, 8 GPUs, load 1.2)")
    print(f"  all policies          {full:7.2f} s   (target < 60 s)")
    print(f"  exclusive only        {base:7.2f} s   (same run baseline)")
    print(f"  ratio                 {full / base:7.2f}x")


if __name__ == "__main__":
    main()

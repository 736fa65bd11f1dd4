"""Shared timing helpers: medians over repeated runs, and ratios against a same-run baseline."""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence


def time_call(fn: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def time_process(argv: Sequence[str], repeats: int, **kwargs) -> list[float]:
    """Wall time of a whole process, start-up included (what a user waits for)."""
    def once() -> None:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       **kwargs)
    return time_call(once, repeats)


def compile_package() -> None:
    """Byte-compile iadeep_cli once, as installing it does (``make``'s set-up and pip's
    regular install), before timing whole ``iadeep`` processes: where PYTHONDONTWRITEBYTECODE
    is set (this test machine sets it) Python never writes the cache itself, and every run
    compiled some 30 modules from source again (~0.1 s a command), which no installed copy
    does."""
    import iadeep_cli

    subprocess.run([sys.executable, "-m", "compileall", "-q", iadeep_cli.__path__[0]],
                   check=True, stdout=subprocess.DEVNULL)


PYTHON_PASS = "python -c pass"


def python_pass(repeats: int) -> tuple[str, list[float]]:
    """The baseline row of the command benchmarks: a bare interpreter's start, which every
    ``iadeep`` process pays too, timed in the same run (so a loaded machine slows both)."""
    return PYTHON_PASS, time_process([sys.executable, "-c", "pass"], repeats)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def report(rows: Sequence[tuple[str, Sequence[float]]], baseline: str) -> None:
    """Print median and ratio to the baseline row for each row."""
    base = median(dict(rows)[baseline])
    print(f"{'what':<40} {'median':>10} {'vs ' + baseline:>18}")
    for name, xs in rows:
        print(f"{name:<40} {median(xs) * 1000:>8.1f}ms {median(xs) / base:>17.2f}x")


def slowest(rows: Sequence[tuple[str, Sequence[float]]], what: str, target_s: float,
            detail: str = "") -> None:
    """Print the slowest row's median against the issue's target: OK or MISSED."""
    worst = max(median(xs) for _, xs in rows)
    print(f"slowest {what} median {worst * 1000:.0f} ms{detail} "
          f"(target < {target_s * 1000:.0f} ms): {'OK' if worst < target_s else 'MISSED'}")

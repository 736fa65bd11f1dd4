"""How long one monitor update takes for 64 nodes x 8 GPUs and 2,000 queued jobs.

An "update" is what happens every poll interval once the worker has the data: build the view
model, update the 64 node cards in place and refill the queue table (``MonitorApp.apply``),
measured inside a running app (``run_test``). ``+paint`` also waits until Textual has
processed the resulting messages and repainted (``pilot.pause``). Each update gets new data
(the clock moves and every GPU's utilisation changes), so nothing is skipped as unchanged.

Baselines measured in the same run: building the view-model rows alone, and the same update of
an empty cluster. Usage: ``.venv/bin/python benchmarks/bench_tui.py [--repeats 15]``
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))   # helpers.seed


def _seeded(scenario: str):
    os.environ["IADEEP_HOME"] = tempfile.mkdtemp(prefix=f"bench-tui-{scenario}-")
    from helpers import seed
    from iadeep_cli.tui import source

    seed.seed_state_dir(scenario)
    return source.fetch()


def _variants(data, n: int, shift: bool = False):
    """n copies of the data, each with different GPU utilisations (so every card changes);
    with ``shift``, each copy also drops the oldest queued job, so every queue row moves."""
    from iadeep_cli.jobs import JobState

    replace = dataclasses.replace
    out = []
    queued = sorted((j for j in data.jobs if j.state is JobState.QUEUED),
                    key=lambda j: j.submitted_at)
    for i in range(n):
        jobs = data.jobs
        if shift:
            gone = {j.id for j in queued[:i + 1]}
            jobs = [j for j in data.jobs if j.id not in gone]
        nodes = tuple(replace(node, gpus=tuple(
            replace(gpu, sample=replace(gpu.sample, utilization_gpu=float(
                (i * 7 + gpu.sample.index * 13) % 101))) for gpu in node.gpus))
            for node in data.status.nodes)
        out.append(type(data)(replace(data.status, nodes=nodes), jobs, data.stale_since))
    return out


def _ms(samples):
    return statistics.median(samples) * 1000


async def _in_app(data, repeats: int, now0: float, shift: bool = False):
    from iadeep_cli.tui.app import MonitorApp

    app = MonitorApp(initial=data, now=lambda: now0, user="bench", auto_refresh=False)
    apply_s, paint_s = [], []
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        for i, variant in enumerate(_variants(data, repeats, shift)):
            app.now = lambda t=now0 + i + 1: t          # ages change: every row is new
            t0 = time.perf_counter()
            app.apply(variant)
            t1 = time.perf_counter()
            await pilot.pause()
            t2 = time.perf_counter()
            apply_s.append(t1 - t0)
            paint_s.append(t2 - t0)
        rows = app.query_one("#queue").row_count
        cards = len(app._cards)
    return apply_s, paint_s, rows, cards


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    from helpers import seed
    from iadeep_cli.tui import viewmodel as vm

    t0 = time.perf_counter()
    large = _seeded("large")
    empty = _seeded("empty")
    print(f"seeded + fetched in {time.perf_counter() - t0:.1f}s: {len(large.status.nodes)} "
          f"nodes, {sum(len(n.gpus) for n in large.status.nodes)} GPUs, "
          f"{len(large.jobs)} unfinished jobs")

    vm_s = []
    for i, variant in enumerate(_variants(large, args.repeats)):
        t = time.perf_counter()
        vm.build_view(variant, seed.NOW + i + 1)
        vm_s.append(time.perf_counter() - t)

    apply_s, paint_s, rows, cards = asyncio.run(_in_app(large, args.repeats, seed.NOW))
    e_apply, e_paint, _, _ = asyncio.run(_in_app(empty, args.repeats, seed.NOW))
    s_apply, s_paint, _, _ = asyncio.run(_in_app(large, args.repeats, seed.NOW, shift=True))

    print(f"in app: {cards} cards, {rows} table rows; medians of {args.repeats} updates")
    print(f"  baseline view model only (large)   {_ms(vm_s):8.1f} ms")
    for label, apply, paint in (("baseline update, empty cluster", e_apply, e_paint),
                                ("update, 64x8 GPUs + 2000 queued", apply_s, paint_s),
                                ("same, queue head leaves each time", s_apply, s_paint)):
        print(f"  {label:<33}  {_ms(apply):8.1f} ms   +paint {_ms(paint):6.1f} ms")
    print(f"  ratio update / view model          {_ms(apply_s) / _ms(vm_s):8.2f}x")
    print(f"  ratio update+paint / empty update  {_ms(paint_s) / max(_ms(e_paint), 1e-6):8.2f}x")
    worst = max(_ms(apply_s), _ms(s_apply))
    print(f"  target: update (data -> widgets refreshed) < 100 ms -> "
          f"{'OK' if worst < 100 else 'OVER'} (worst median {worst:.1f} ms)")
    print("  (+paint includes pilot.pause()'s own cost, ~ the empty-cluster +paint figure)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

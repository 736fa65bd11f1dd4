"""steps/foreign.py's spells on a real store: what starts, keeps and ends one, and which
messages a reported spell queues (the lab's webhook, each admin with an address)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from iadeep_cli.controller.round.steps.foreign import ForeignWatch
from iadeep_cli.inventory import parse_inventory
from iadeep_cli.snapshot import ClusterSnapshot, GpuProcess, GpuSample, NodeSnapshot
from iadeep_cli.store import Store, foreign

LAB = ("lab:\n  idle_after: 60\n  admins: [alice, bob]\n  notify:\n    smtp: mail:25\n"
       "    addresses:\n      alice: alice@lab.example.org\n"
       "    webhook: http://127.0.0.1:9/hook\nnodes:\n  - name: n1\n    host: h\n")
HOLDER = (GpuProcess(7, 2048.0, "/usr/bin/python3"),)


def _snap(util: float | None, procs: tuple[GpuProcess, ...] = HOLDER,
          reached: bool = True) -> ClusterSnapshot:
    gpu = GpuSample(0, "GPU-0", "NVIDIA H200", utilization_gpu=util, processes=tuple(procs))
    node = NodeSnapshot("n1", 0.0, (gpu,), jobs=() if reached else None)
    return ClusterSnapshot(0.0, (node,))


def test_a_spell_is_recorded_once_kept_while_unseen_and_ended_when_busy(tmp_path):
    store = Store(tmp_path / "s.db")
    loop = SimpleNamespace(store=store, inventory=parse_inventory(LAB, Path("nodes.yaml")))
    watch = ForeignWatch(loop)
    assert watch.step(loop, _snap(0.0), 0.0) == []
    assert watch.step(loop, _snap(1.0), 59.0) == []            # at or below 5 %: goes on
    made = watch.step(loop, _snap(0.0), 60.0)
    assert len(made) == 1
    assert watch.step(loop, _snap(0.0), 120.0) == []           # once a spell
    assert watch.step(loop, _snap(None, reached=False), 200.0) == []   # unanswered: kept
    with store.read() as conn:
        [spell] = foreign.open_spells(conn)
        notes = conn.execute("SELECT channel, recipient FROM outbox WHERE foreign_id IS NOT NULL "
                             "ORDER BY channel").fetchall()
    assert (spell.node, spell.gpu, spell.pid, spell.since) == ("n1", 0, 7, 0.0)
    assert [tuple(n) for n in notes] == [("email", "alice"), ("webhook", "")]   # bob: no address
    # a restarted controller goes on with it; a busy poll ends it
    again = ForeignWatch(loop)
    assert again.step(loop, _snap(0.0), 300.0) == []
    again.step(loop, _snap(80.0), 301.0)
    with store.read() as conn:
        assert foreign.open_spells(conn) == []
    # a job's process (not foreign) on an idle GPU is no foreign spell
    ours = (GpuProcess(8, 2048.0, "python3", job_id=1),)
    assert again.step(loop, _snap(0.0, ours), 400.0) == []
    assert again.step(loop, _snap(0.0, ours), 500.0) == []


def test_the_process_gone_from_the_gpu_ends_its_spell(tmp_path):
    store = Store(tmp_path / "s.db")
    loop = SimpleNamespace(store=store, inventory=parse_inventory(LAB, Path("nodes.yaml")))
    watch = ForeignWatch(loop)
    watch.step(loop, _snap(0.0), 0.0)
    assert watch.step(loop, _snap(0.0), 60.0)
    watch.step(loop, _snap(0.0, procs=()), 61.0)
    with store.read() as conn:
        assert foreign.open_spells(conn) == []
    watch.step(loop, _snap(0.0), 62.0)                          # back: a new spell
    assert watch.step(loop, _snap(0.0), 100.0) == []
    assert len(watch.step(loop, _snap(0.0), 122.0)) == 1

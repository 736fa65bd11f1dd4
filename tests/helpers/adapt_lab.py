"""A lab for the run-time adaptation end-to-end tests: one real sshd node with one (stand-in)
GPU, a real controller whose database already holds the emulator's profile (``EMU``: what
``contention.py`` runs at alone)."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from helpers.controllers import ControllerProcess
from iadeep_cli.profiles import Profile
from iadeep_cli.store import Store, profiles as profrows

EMULATOR = Path(__file__).resolve().parent / "contention.py"
# the lab profiled the emulator before: 100 it/s alone (what contention.py's SOLO_S gives)
EMU = Profile("emu", gpu_util=20, mem_util=5, peak_mem_gib=1, gpu_model="NVIDIA H200",
              solo_it_per_s=100.0)


@contextlib.contextmanager
def emulator_lab(sshd_cluster, tmp_path: Path, adapt: str, util: float = 97
                 ) -> Iterator[ControllerProcess]:
    """A started controller (``.node``: its one node's name, ``.cluster``: the sshd nodes)
    with ``lab.policy.adapt`` set to the YAML flow mapping ``adapt``; stopped, and the node's
    jobs killed, on leaving. Its GPU reports ``util`` % busy (by default as busy as a GPU two
    jobs contend for: the shipped pairs worse than serial are of jobs 96-97% busy alone)."""
    cluster = sshd_cluster(1)
    node = next(iter(cluster.nodes))
    cluster.nodes[node].set_fake(gpus=1, util=util)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 30\n  kill_grace: 3\n"
                         f"  policy:\n    adapt: {adapt}\n" + cluster.inventory_yaml())
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    store = Store(home / "iadeep.db")
    with store.tx() as conn:
        profrows.upsert_profile(conn, EMU, time.time())
    store.close()
    ctl = ControllerProcess(home, inventory).start()
    ctl.node, ctl.cluster = node, cluster
    try:
        yield ctl
    finally:
        ctl.stop()
        cluster.kill_jobs()


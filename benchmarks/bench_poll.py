"""One poll cycle of 16 real sshd nodes (127.0.0.2..17): iadeep's pooled, concurrent polling vs
what a user would script (OpenSSH `ssh node nvidia-smi ...` per node, one after another).

Both run in the same process on the same nodes with the same stand-in nvidia-smi; prints both
medians and the ratio.  Targets: iadeep cycle < 0.5 s and >= 5x faster than the baseline.
Usage: .venv/bin/python benchmarks/bench_poll.py [--nodes 16] [--cycles 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers.sshd import Cluster


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--cycles", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), args.nodes)
        os.environ["HOME"] = str(cluster.home)
        os.environ["IADEEP_HOME"] = str(cluster.home / "state")
        from iadeep_cli.nodes.gpu import APP_QUERY, GPU_QUERY
        from iadeep_cli.nodes.poller import NodePool

        try:
            pool = NodePool(cluster.inventory)
            first = pool.poll_all()                  # connects (not part of a steady cycle)
            assert all(n.ok for n in first.nodes), [n.error for n in first.nodes if n.error]
            ours = []
            for _ in range(args.cycles):
                t = time.perf_counter()
                snap = pool.poll_all()
                ours.append(time.perf_counter() - t)
                assert all(n.ok for n in snap.nodes)
            pool.close()
            ssh_cfg = cluster.home / ".ssh" / "config"
            base = []
            for _ in range(args.cycles):
                t = time.perf_counter()
                for name in cluster.nodes:
                    subprocess.run(
                        ["ssh", "-F", str(ssh_cfg), "-o", "BatchMode=yes",
                         "-o", f"UserKnownHostsFile={cluster.known_hosts}",
                         "-o", "StrictHostKeyChecking=yes", f"{name}-alias",
                         f"{GPU_QUERY}; {APP_QUERY}"], check=True, capture_output=True)
                base.append(time.perf_counter() - t)
        finally:
            cluster.shutdown()
    m_ours, m_base = statistics.median(ours), statistics.median(base)
    print(f"nodes={args.nodes} cycles={args.cycles} cpus={os.cpu_count()}")
    print(f"iadeep pooled concurrent cycle: median {m_ours:.3f} s "
          f"(min {min(ours):.3f}, max {max(ours):.3f})")
    print(f"baseline ssh one by one:        median {m_base:.3f} s "
          f"(min {min(base):.3f}, max {max(base):.3f})")
    print(f"ratio baseline/iadeep: {m_base / m_ours:.1f}x "
          f"(targets: < 0.5 s {'met' if m_ours < 0.5 else 'MISSED'}, >= 5x "
          f"{'met' if m_base / m_ours >= 5 else 'MISSED'})")


if __name__ == "__main__":
    main()

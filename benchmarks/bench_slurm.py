"""What the Slurm backend costs on top of Slurm itself, on a real single-machine Slurm 22.05
(started here as in the tests; needs root and `make slurm`).

- The poll a scheduling round makes of a Slurm partition (``SlurmPool.poll_slurm``: one
  ``sinfo --json`` and one ``squeue --json``, parsed into GPU snapshots and job states) vs the
  two bare commands (the baseline: what any Slurm client pays to read the same).
- A placement's submission (``slurm.launch``: the look-up of the attempt's name that keeps it
  exactly once, then ``sbatch`` as the owner, pinned to the GPU) vs a bare ``sbatch`` of the
  same script with the same options (the baseline).
Both with ``--queued`` other jobs in Slurm's queue (pending, held), as a busy cluster has.
Usage: .venv/bin/python benchmarks/bench_slurm.py [--repeats 15] [--queued 50]
"""
from __future__ import annotations

import argparse
import os
import pwd
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, time_call
from helpers.accounts import ensure_user
from helpers.slurm import HERE, NGPU, SHARDS, missing

USER = "iadeep-bench"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--queued", type=int, default=50)
    args = ap.parse_args()
    if why := missing():
        sys.exit(f"bench_slurm: {why}")
    from iadeep_cli.inventory import parse_inventory
    from iadeep_cli.jobs import Job, JobSpec, JobState
    from iadeep_cli.nodes import slurm

    root = Path(tempfile.mkdtemp(prefix="iadeep-bench-slurm-"))
    env = {**os.environ, "T": str(root), "NGPU": str(NGPU), "SHARDS": str(SHARDS),
           "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    subprocess.run(["bash", str(HERE / "slurm_up.sh")], env=env, check=True)
    conf = root / "etc" / "slurm.conf"
    senv = {**env, "SLURM_CONF": str(conf)}
    try:
        uid = ensure_user(USER)
        gid = pwd.getpwnam(USER).pw_gid
        work = root / "jobs"
        script = work / "bench.sh"
        script.write_text("#!/bin/sh\ntrue\n")
        script.chmod(0o755)
        text = (f"nodes: []\nslurm:\n  partition: debug\n  shards_per_gpu: {SHARDS}\n"
                f"  conf: {conf}\n")
        inv = slurm.with_slurm_nodes(parse_inventory(text, Path("nodes.yaml")))
        node = inv.nodes[0].name
        pool = slurm.SlurmPool(inv, None, "benchinstall", lambda ids: dict.fromkeys(ids, 1))
        for _ in range(args.queued):   # held jobs: in the queue, never running
            subprocess.run(["sbatch", "-H", f"--uid={uid}", f"--gid={gid}", "-o", "/dev/null",
                            "--wrap", "true"], env=senv, check=True, capture_output=True)
        expect = {node: tuple((i, None, None) for i in range(1, 9))}
        base_poll = time_call(lambda: [subprocess.run(c, env=senv, check=True,
                                                      capture_output=True)
                                       for c in (["sinfo", "--json"], ["squeue", "--json"])],
                              args.repeats)
        ours_poll = time_call(lambda: pool.poll_slurm(inv.nodes, expect), args.repeats)
        snap = pool.poll_slurm(inv.nodes, expect)[0]
        assert snap.ok and len(snap.gpus) == NGPU, snap

        counter = iter(range(1000, 100000))

        def bare() -> None:
            subprocess.run(["sbatch", "--parsable", f"--uid={uid}", f"--gid={gid}",
                            "--export=ALL", "--get-user-env", "--partition=debug",
                            f"--nodelist={node}", "--gres=shard:g0:2",
                            f"--job-name=bare-{next(counter)}", f"--chdir={work}",
                            "-o", "/dev/null", str(script)], env=senv, check=True,
                           capture_output=True)

        def ours() -> None:
            job = Job(id=next(counter), owner=USER, state=JobState.STARTING,
                      spec=JobSpec(script=str(script), workdir=str(work), workload="mlp"),
                      submitted_at=time.time(), node=node, attempts=1)
            slurm.launch(pool, node, job, (0,), script)

        base_sbatch = time_call(bare, args.repeats)
        ours_sbatch = time_call(ours, args.repeats)
        print(f"Slurm 22.05, 1 node x {NGPU} GPUs, {args.queued} other jobs queued, "
              f"{args.repeats} repeats")
        report([("sinfo --json + squeue --json (baseline)", base_poll),
                ("SlurmPool.poll_slurm (a round's poll)", ours_poll)],
               "sinfo --json + squeue --json (baseline)")
        report([("bare sbatch (baseline)", base_sbatch),
                ("slurm.launch: look-up + sbatch", ours_sbatch)], "bare sbatch (baseline)")
    finally:
        subprocess.run(["scancel", "--full", "-u", USER], env=senv, capture_output=True)
        subprocess.run(["bash", str(HERE / "slurm_down.sh")], env=env, capture_output=True)


if __name__ == "__main__":
    main()

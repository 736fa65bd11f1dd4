"""A real single-machine Slurm 22.05 (Debian's packages) for the Slurm backend's tests.

``slurm_up.sh``/``slurm_down.sh`` are the recipe from the project's Slurm notes: munged with
its own key and socket, slurmctld and one slurmd in the background (no systemd), and fake GPUs
that Slurm accepts (character devices, typed per GPU: ``gpu:g0``, ``shard:g0``...), so that a
job can be pinned to one GPU and CUDA_VISIBLE_DEVICES says which. Nothing in /etc is touched;
the daemons are stopped by pid. Starting it takes about half a second once the packages are
installed (``make slurm``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.accounts import cli_as, ensure_user
from helpers.controllers import ControllerProcess, cli, wait_until

HERE = Path(__file__).parent
NGPU, SHARDS = 2, 4
USER = "iadeep-slurm-u"   # the real second account whose jobs Slurm runs


@dataclass(frozen=True)
class SlurmCluster:
    root: Path        # the daemons' directory (config, logs, fake devices)
    conf: Path        # SLURM_CONF
    node: str         # the one node's name
    partition: str = "debug"

    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def inventory(self, poll_interval: float = 0.5, extra: str = "") -> str:
        return (f"lab:\n  poll_interval: {poll_interval}\n{extra}nodes: []\n"
                f"slurm:\n  partition: {self.partition}\n  shards_per_gpu: {SHARDS}\n"
                f"  conf: {self.conf}\n")


def missing() -> str | None:
    """Why Slurm cannot be started here, or None."""
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd and submitting as other users needs root (CI is root)"
    for exe in ("slurmctld", "slurmd", "sbatch", "munged"):
        if shutil.which(exe, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return (f"{exe} is not installed: `make slurm` installs Debian's slurmctld slurmd "
                    "slurm-client munge")
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    why = missing()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="iadeep-slurm-"))
    env = {**os.environ, "T": str(root), "NGPU": str(NGPU), "SHARDS": str(SHARDS),
           "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    up = subprocess.run(["bash", str(HERE / "slurm_up.sh")], env=env, capture_output=True,
                        text=True, timeout=120)
    if up.returncode != 0:
        subprocess.run(["bash", str(HERE / "slurm_down.sh")], env=env, capture_output=True)
        raise AssertionError(f"Slurm did not start: {up.stdout}{up.stderr}")
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    try:
        yield SlurmCluster(root, root / "etc" / "slurm.conf", node)
    finally:
        subprocess.run(["bash", str(HERE / "slurm_down.sh")], env=env, capture_output=True,
                       timeout=120)


@pytest.fixture()
def lab(slurm_cluster):
    """A controller whose inventory is the Slurm partition alone, and a user's directory with
    a script that waits for a file (so the test decides when jobs end) and says where it ran."""
    ensure_user(USER)
    root = Path(tempfile.mkdtemp(prefix="iadeep-slurm-lab-", dir="/tmp"))
    os.chmod(root, 0o755)   # the user reaches the socket and its directory inside
    work = root / "work"
    work.mkdir()
    shutil.chown(work, USER)
    script = work / "job.sh"
    script.write_text('#!/bin/sh\n'
                      'echo "cuda=$CUDA_VISIBLE_DEVICES user=$(id -un) job=$IADEEP_JOB_ID '
                      'slurm=$SLURM_JOB_ID"\n'
                      'while [ ! -e "$1" ]; do sleep 0.1; done\necho done\n')
    script.chmod(0o755)
    inventory = root / "nodes.yaml"
    inventory.write_text(slurm_cluster.inventory())
    ctl = ControllerProcess(root / "home", inventory).start()
    yield ctl, work, slurm_cluster
    ctl.stop()
    slurm_cluster.run("scancel", "--full", "-u", USER)
    wait_until(lambda: not slurm_cluster.run("squeue", "-h", "-u", USER, "-t", "R,CG,PD,S"),
               limit=120)
    shutil.rmtree(root, ignore_errors=True)


def add(ctl, work: Path, *args: str) -> int:
    out = cli_as(USER, ctl.home, "queue", "add", "--chdir", str(work), *args)
    assert out["rc"] == 0, out
    return int(out["out"].strip())


def show(ctl, job_id: int) -> dict:
    proc = cli(ctl.home, "queue", "show", str(job_id), "--json", check=True)
    return json.loads(proc.stdout)


def slurm_jobs(cluster) -> dict[int, dict]:
    """Slurm's own view: job id -> its record in ``squeue --json``."""
    data = json.loads(cluster.run("squeue", "--json"))
    return {int(j["job_id"]): j for j in data["jobs"]}

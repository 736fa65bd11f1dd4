"""A new program over SSH (``policy.cold_start: share``, the default): a real sshd node whose
stand-in nvidia-smi replays ``pmon`` with per-job figures, a real controller process and the
real CLI. While the node's pmon fails, a program with no profile waits for an empty GPU and
`queue why` says why; once pmon answers, it starts beside the running job under a provisional
profile and its profile is recorded from its own processes' figures while it shares."""
from __future__ import annotations

import json
import sys

from helpers.adapt_lab import EMULATOR, emulator_lab
from helpers.controllers import cli, jobs_by_id, queue_add, wait_jobs, wait_until


def _own(home, job: int) -> list[dict]:
    """The job's processes in the controller's latest poll (`status --json`)."""
    status = json.loads(cli(home, "status", "--json", check=True).stdout)
    return [p for n in status["nodes"] for g in n["gpus"] for p in g["processes"]
            if p["job_id"] == job]


def test_over_ssh_a_new_program_shares_a_gpu_and_is_profiled_from_its_own_figures(
        sshd_cluster, tmp_path):
    with emulator_lab(sshd_cluster, tmp_path, "{}", util=40) as ctl:
        home, node = ctl.home, ctl.cluster.nodes[ctl.node]
        (node.state / "nopmon").write_text("1\n")   # pmon fails, as where a driver lacks it
        script = tmp_path / "emu.sh"
        script.write_text(f"#!/bin/sh\nexec {sys.executable} {EMULATOR} {tmp_path / 'gpu'} "
                          "1000000\n")
        script.chmod(0o755)
        a = queue_add(home, str(script), "--workload", "emu")
        wait_jobs(home, lambda js: js[a]["state"] == "running")
        assert wait_until(lambda: _own(home, a))   # its process seen, with no SM share
        assert all(p["sm_util"] is None for p in _own(home, a))
        b = queue_add(home, str(script), "--workload", "fresh")
        why = wait_until(lambda: (lambda out: out if "per-process" in out else None)(
            cli(home, "queue", "why", str(b), check=True).stdout))
        assert (f"job {b} is queued: no profile yet: waits for an empty GPU to profile on "
                f"(node {ctl.node}'s poll gives no per-process figures") in why

        node.set_pmon({a: (20, 5), "*": (35, 9)})
        (node.state / "nopmon").unlink()
        jobs = wait_jobs(home, lambda js: js[b]["state"] == "running")
        assert jobs[a]["state"] == "running"   # b started beside a, not after it
        assert (jobs[b]["node"], jobs[b]["gpu_indices"]) == (jobs[a]["node"],
                                                            jobs[a]["gpu_indices"])

        def profiled():
            shown = cli(home, "profile", "show", "fresh", "--json")
            return json.loads(shown.stdout) if shown.returncode == 0 else None
        profile = wait_until(profiled, limit=120)
        assert profile["source"].startswith(f"job {b} (")
        own = _own(home, b)
        assert profile["gpu_util"] == sum(p["sm_util"] for p in own)   # its own, not the GPU's
        assert profile["mem_util"] == sum(p["mem_util"] for p in own)
        assert profile["gpu_util"] != 40   # the whole GPU's utilisation
        assert jobs_by_id(home)[a]["state"] == "running"   # profiled while it shared

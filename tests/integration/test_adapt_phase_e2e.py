"""Phase changes end to end: a real sshd node, a real controller process, the real CLI, and a
stand-in job (``helpers/contention.py`` with ``CONTENTION_PHASE``) whose progress rate alone
really drops partway. The controller must record a phase event naming the job with the old and
new rates, give the workload a phase profile sample held as its owner's, which an admin's
`profile pin --adopt` makes the lab's profile (learning does not average it in, nor reject it
as an outlier), and leave a ``--no-adapt`` job alone. And over SSH, where the poll's
``nvidia-smi pmon`` gives each process's SM share (the stand-in replays it, with per-job
figures the test changes), a job's phase change is found while it shares its GPU."""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from helpers.adapt_lab import EMU, EMULATOR, emulator_lab
from helpers.controllers import cli, jobs_by_id, queue_add, wait_jobs, wait_until
from iadeep_cli.profiles import Profile
from iadeep_cli.store import profiles as profrows


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    # a drop to a tenth of the rate, against a threshold of a half: a loaded test machine's
    # slower iterations are not mistaken for it
    with emulator_lab(sshd_cluster, tmp_path, "{observe_s: 0, polls: 3, window_s: 1.0, "
                      "phase_threshold: 0.5, phase_persist_s: 1}") as ctl:
        yield ctl


def _phase_job(tmp_path: Path, name: str, fast: int, slow: int) -> str:
    """``fast`` iterations at 100 it/s, then ``slow`` more at 10 it/s, alone."""
    script = tmp_path / f"{name}.sh"
    script.write_text(f"#!/bin/sh\nCONTENTION_PHASE={fast}:0.1 exec {sys.executable} "
                      f"{EMULATOR} {tmp_path / name} {fast + slow}\n")
    script.chmod(0o755)
    return str(script)


def _samples(home: Path) -> list[sqlite3.Row]:
    conn = sqlite3.connect(f"file:{home / 'iadeep.db'}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT * FROM profile_samples WHERE workload='emu' "
                            "ORDER BY id").fetchall()
    finally:
        conn.close()


def _profile(home: Path) -> tuple[Profile, str]:
    conn = sqlite3.connect(f"file:{home / 'iadeep.db'}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        [(profile, source, _)] = [p for p in profrows.load_profiles(conn)
                                  if p[0].workload == "emu"]
        return profile, source
    finally:
        conn.close()


def test_a_job_alone_that_changes_phase_refreshes_its_profile(lab, tmp_path):
    home = lab.home
    # --no-adapt: the same change, and nothing is done about it
    opted = queue_add(home, _phase_job(tmp_path, "opted", 100, 100),
                      "--workload", "emu", "--no-adapt")
    wait_jobs(home, lambda js: js[opted]["state"] in ("succeeded", "failed"))
    assert _samples(home) == []
    assert _profile(home)[0].solo_it_per_s == 100.0
    assert "phase change" not in cli(home, "queue", "show", str(opted), check=True).stdout

    job = queue_add(home, _phase_job(tmp_path, "phased", 150, 250), "--workload", "emu")
    wait_jobs(home, lambda js: js[job]["state"] in ("succeeded", "failed")
              or any(s["kind"] == "held" and s["job_id"] == job for s in _samples(home)))
    samples = [s for s in _samples(home) if s["kind"] == "held"]
    assert samples and samples[-1]["job_id"] == job and samples[-1]["accepted"] == 0
    # one user's job: held as theirs, until another user's agrees or an admin adopts it
    assert _profile(home)[0] == EMU
    cli(home, "profile", "pin", "emu", "--adopt", samples[-1]["owner"], check=True)
    refreshed, source = _profile(home)
    assert source.startswith(f"phase change of job {job} (")
    assert refreshed.solo_it_per_s is not None and refreshed.solo_it_per_s < 20   # was 100
    assert refreshed.peak_mem_gib == EMU.peak_mem_gib    # what the poll does not show, kept
    shown = cli(home, "queue", "show", str(job), check=True).stdout
    assert f"phase change: job {job} (emu) alone: progress rate 100 it/s -> " in shown
    assert "profile 'emu' on NVIDIA H200 held as root's until a job of another user" in shown
    why = cli(home, "queue", "why", str(job), check=True).stdout
    assert "phase change" in why or jobs_by_id(home)[job]["state"] != "running"
    jobs = wait_jobs(home, lambda js: js[job]["state"] in ("succeeded", "failed"))
    assert jobs[job]["state"] == "succeeded" and jobs[job]["attempts"] == 1
    # later samples of 'emu' learn against the refreshed profile, not the old 100 it/s
    assert _profile(home)[0].solo_it_per_s == refreshed.solo_it_per_s


def _sm_shares(home: Path) -> dict[int, float | None]:
    """Job id -> its process's SM share in the controller's latest poll (`status --json`)."""
    status = json.loads(cli(home, "status", "--json", check=True).stdout)
    return {p["job_id"]: p["sm_util"] for n in status["nodes"] for g in n["gpus"]
            for p in g["processes"] if p["job_id"] is not None}


def test_over_ssh_a_sharing_jobs_phase_change_is_found_while_it_shares(sshd_cluster, tmp_path):
    """Two emulator jobs time-slice one GPU of an sshd node (each at about a quarter of its
    rate alone). pmon gives each 5% of the SMs (EMU's 20% alone at that speed), then job A's
    rises to 20%, that of an 80% workload: A's estimate alone (share over speed) moves from
    20% to about 80% while B still shares with it; the controller records A's phase change
    with its numbers and gives B none. The GPU reports EMU's 20% alone, A's start. A move of
    25 points is a phase change: B's estimate, against the lab's solo rate, would move that
    far only below speed 0.11 (a machine loaded past what its iterations show), A's at any
    speed under 0.44."""
    adapt = ("{observe_s: 0, polls: 3, window_s: 1.0, phase_threshold: 0.5, phase_util: 25, "
             "phase_persist_s: 1}")
    with emulator_lab(sshd_cluster, tmp_path, adapt, util=20) as ctl:
        home, node = ctl.home, ctl.cluster.nodes[ctl.node]
        node.set_pmon({"*": (5, 1)})
        script = tmp_path / "emu.sh"
        script.write_text(f"#!/bin/sh\nexec {sys.executable} {EMULATOR} {tmp_path / 'gpu'} "
                          "1000000\n")
        script.chmod(0o755)
        a = queue_add(home, str(script), "--workload", "emu")
        wait_jobs(home, lambda js: js[a]["observed_speed"] is not None)
        b = queue_add(home, str(script), "--workload", "emu")
        wait_jobs(home, lambda js: js[b]["state"] == "running"
                  and js[a]["observed_speed"] is not None and js[a]["observed_speed"] < 0.6
                  and js[b]["observed_speed"] is not None)
        assert wait_until(lambda: _sm_shares(home) == {a: 5.0, b: 5.0})   # pmon, over SSH

        def phase_events(job: int) -> list[str]:
            shown = cli(home, "queue", "show", str(job), check=True).stdout
            return [ln for ln in shown.splitlines() if "phase change" in ln]

        assert phase_events(a) == phase_events(b) == []
        node.set_pmon({a: (20, 5), "*": (5, 1)})
        found = "\n".join(wait_until(lambda: phase_events(a), limit=120))
        assert f"phase change: job {a} (emu) sharing its GPU" in found
        assert "GPU utilisation 20% -> " in found and "held as root's" in found
        jobs = jobs_by_id(home)
        assert jobs[a]["state"] == jobs[b]["state"] == "running"   # still sharing
        assert jobs[a]["gpu_indices"] == jobs[b]["gpu_indices"]
        assert phase_events(b) == []
        samples = [s for s in _samples(home) if s["job_id"] == a]
        assert samples and all(s["kind"] == "held" for s in samples)
        assert json.loads(samples[0]["data"])["gpu_util"] >= 50   # was 20

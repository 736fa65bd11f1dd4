"""Run-time adaptation trusts no member's job to act on another member's: real OS accounts
(iadeep-alice, iadeep-bob) whose identity the controller takes from the socket, a real sshd
node with one (stand-in) GPU, a real controller process, the real CLI, and stand-in jobs
(``helpers/contention.py``) whose progress a job's owner controls.

- A member's ``--no-adapt`` job that really shares a GPU and reports a progress collapse
  (faked: its progress file says 5 it/s while it runs at full tilt) gets nobody suspended when
  it joined last; and a partner it slows that joined after it is suspended for at most the
  lab's ``max_suspend_s``, then resumed for good, though the member's job runs on.
- A phase change reported by one member's job is held as that member's profile: the lab's
  profile, which every member's placement uses, changes only when another member's job agrees.
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from helpers.accounts import (
    ACCOUNT_TESTS,
    ALICE,
    BOB,
    cli_as,
    sh_script,
    shared_dir,
    submitted,
)
from helpers.adapt_lab import EMU, EMULATOR, emulator_lab
from helpers.controllers import cli, jobs_by_id, wait_jobs, wait_until
from iadeep_cli.profiles import Profile
from iadeep_cli.store import profiles as profrows

pytestmark = ACCOUNT_TESTS   # creates Unix accounts


@pytest.fixture
def top():
    with shared_dir("iadeep-adapt-trust-") as path:
        yield path


def _db(home: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{home / 'iadeep.db'}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    return conn


def _emu_profile(home: Path) -> tuple[Profile, str]:
    conn = _db(home)
    try:
        [(profile, source, _)] = [p for p in profrows.load_profiles(conn)
                                  if p[0].workload == "emu"]
        return profile, source
    finally:
        conn.close()


def _sample_of(home: Path, job_id: int) -> sqlite3.Row | None:
    conn = _db(home)
    try:
        return conn.execute("SELECT * FROM profile_samples WHERE job_id=?", (job_id,)).fetchone()
    finally:
        conn.close()


def _moves(home: Path, job_id: int) -> list[tuple[str, str]]:
    shown = json.loads(cli(home, "queue", "show", str(job_id), "--json", check=True).stdout)
    return [(e["old_state"], e["new_state"]) for e in shown["events"]]


def test_a_members_faked_collapse_cannot_keep_anothers_job_suspended(sshd_cluster, top):
    with emulator_lab(sshd_cluster, top, "{observe_s: 0, polls: 3, window_s: 1.0, "
                      "suspend: true, max_suspend_s: 3}") as lab:
        home = lab.home
        # $1: the emulator's directory of heartbeats (a new one per part: a killed job's stays),
        # shared by the jobs on the GPU: they really slow each other
        honest = sh_script(top, "honest.sh", f"exec {sys.executable} {EMULATOR} {top}/$1 $2")
        # alice's job contends for real at full tilt (its own progress goes nowhere) and tells
        # the controller it runs at 100 it/s alone, and at 5 it/s once another job shares
        faker = sh_script(top, "faker.sh", (
            f"IADEEP_PROGRESS_FILE=/dev/null {sys.executable} {EMULATOR} {top}/$1 1000000 &\n"
            f"n=0; while :; do if [ $(ls {top}/$1 | wc -l) -gt 1 ]; then n=$((n+1)); "
            "else n=$((n+20)); fi; echo \"$(date +%s.%N) $n\" >> \"$IADEEP_PROGRESS_FILE\"; "
            "sleep 0.2; done"))

        # 1. bob's job was there first; alice's --no-adapt job joins it and "collapses"
        bob = submitted(cli_as(BOB, home, "queue", "add", "--workload", "emu", honest,
                               "part1", "1000000"))
        wait_jobs(home, lambda js: js[bob]["observed_speed"] is not None)
        alice = submitted(cli_as(ALICE, home, "queue", "add", "--workload", "emu",
                                 "--no-adapt", faker, "part1"))
        jobs = wait_jobs(home, lambda js: js[bob]["state"] == "suspended"
                         or "nobody is suspended" in (js[bob]["reason"] or ""))
        assert jobs[bob]["state"] == "running", jobs[bob]["reason"]
        assert f"job {alice}, the last to join of those slowed, is --no-adapt" in \
            jobs[bob]["reason"]
        cli(home, "queue", "cancel", str(alice), str(bob), check=True)
        wait_jobs(home, lambda js: {js[alice]["state"], js[bob]["state"]} == {"cancelled"})
        assert ("running", "suspended") not in _moves(home, bob)

        # 2. alice's job is there first; bob's joins, is slowed and suspended: for at most the
        # lab's 3 s, though alice's job runs on, and not again
        alice = submitted(cli_as(ALICE, home, "queue", "add", "--workload", "emu",
                                 "--no-adapt", faker, "part2"))
        wait_jobs(home, lambda js: js[alice]["observed_speed"] is not None)
        bob = submitted(cli_as(BOB, home, "queue", "add", "--workload", "emu", honest, "part2",
                               "300"))
        wait_jobs(home, lambda js: js[bob]["state"] == "suspended")
        jobs = wait_jobs(home, lambda js: js[bob]["state"] in ("succeeded", "failed"),
                         timeout=120)
        assert jobs[bob]["state"] == "succeeded" and jobs_by_id(home)[alice]["state"] == \
            "running"
        assert _moves(home, bob).count(("running", "suspended")) == 1
        shown = cli(home, "queue", "show", str(bob), check=True).stdout
        assert "the lab's limit (max_suspend_s 3); not suspended for others again" in shown


def test_one_members_phase_change_stays_theirs_until_another_member_agrees(sshd_cluster, top):
    # a drop to a tenth of the rate, against a threshold of a half (as test_adapt_phase_e2e)
    with emulator_lab(sshd_cluster, top, "{observe_s: 0, polls: 3, window_s: 1.0, "
                      "phase_threshold: 0.5, phase_persist_s: 1}") as lab:
        home = lab.home

        def phased(name: str) -> str:   # 150 iterations at 100 it/s, then 250 at 10 it/s
            return sh_script(top, f"{name}.sh", "CONTENTION_PHASE=150:0.1 exec "
                             f"{sys.executable} {EMULATOR} {top / name} 400")

        def reported(job_id: int):
            wait_jobs(home, lambda js: js[job_id]["state"] in ("succeeded", "failed")
                      or _sample_of(home, job_id) is not None)
            return wait_until(lambda: _sample_of(home, job_id), limit=120)

        alice = submitted(cli_as(ALICE, home, "queue", "add", phased("alice"),
                                 "--workload", "emu"))
        held = reported(alice)
        # the lab's profile, which every member's placement uses, is what it was
        assert _emu_profile(home) == (EMU, "measured")
        assert held["kind"] == "held" and held["owner"] == ALICE and not held["accepted"]
        shown = cli(home, "queue", "show", str(alice), check=True).stdout
        assert f"held as {ALICE}'s until a job of another user agrees" in shown
        assert "HELD: held as" in cli(home, "profile", "show", "emu", check=True).stdout
        # a member may not adopt it for the lab
        refused = cli_as(ALICE, home, "profile", "pin", "emu", "--adopt", ALICE)
        assert refused["rc"] != 0 and "may not pin" in refused["err"]
        assert _emu_profile(home) == (EMU, "measured")

        # another member's job shows the same phase alone (once alice's left the GPU): now it
        # is the lab's
        wait_jobs(home, lambda js: js[alice]["state"] in ("succeeded", "failed"))
        bob = submitted(cli_as(BOB, home, "queue", "add", phased("bob"), "--workload", "emu"))
        assert reported(bob)["kind"] == "phase"
        profile, source = _emu_profile(home)
        assert source == f"phase change of jobs {alice} ({ALICE}) and {bob} ({BOB})"
        assert profile.solo_it_per_s is not None and profile.solo_it_per_s < 20   # was 100

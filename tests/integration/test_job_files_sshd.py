"""A member's job shaping its own files cannot slow or stop the lab: real OS accounts, an sshd
node logged into as an unprivileged SSH account, real sudo running each job as its submitter,
and a real controller.  The job swaps its progress file with a FIFO as fast as it can, or
leaves a FIFO where its exit code belongs; another member's job still starts within two poll
intervals, the FIFO job still ends (and can be cancelled), and no reader is left blocked on the
node."""
from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from helpers.accounts import cli_as
from helpers.controllers import jobs_by_id, wait_until
from helpers.runas_lab import RunAsLab, need_tools
from helpers.sshd import proc_files

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.os_global,   # accounts, a sudoers file, /home/<account>
    pytest.mark.skipif(os.geteuid() != 0, reason="creating OS accounts and sudo rules needs root"),
]

LAB = RunAsLab("jf")
ALICE, BOB = LAB.users
POLL_S = 3.0

# Swaps its progress file between a regular file and a FIFO (atomic renames, a few ms each)
# until told to stop: a reader that checks "regular file" and then opens it blocks for good.
SWAPPER = """#!/usr/bin/python3
import os, time
p = os.environ["IADEEP_PROGRESS_FILE"]
d, me = os.path.dirname(p), os.environ["IADEEP_JOB_ID"]
home = os.environ["HOME"]
n = 0
while not os.path.exists(f"{home}/jf-stop-{me}"):
    os.mkfifo(d + "/f.tmp")
    os.rename(d + "/f.tmp", p)
    time.sleep(0.002)
    with open(d + "/r.tmp", "w") as f:
        f.write(f"{time.time():.3f} {n}\\n")
    os.rename(d + "/r.tmp", p)
    n += 1
    if n % 50 == 0:
        with open(f"{home}/jf-swaps-{me}", "w") as f:
            f.write(str(n))
    time.sleep(0.002)
"""
# Leaves a FIFO where the wrapper writes its exit code (and makes the wrapper's temporary file a
# directory, so it cannot replace it); then waits, or ends at once with "end".
FIFO_EXIT = """#!/bin/sh
d=${IADEEP_PROGRESS_FILE%/*}
mkdir "$d/exit.tmp" && mkfifo "$d/exit" && echo ready > "$HOME/jf-ready-$IADEEP_JOB_ID"
[ "$1" = end ] && exit 3
n=0; while [ $n -lt 600 ]; do sleep 1; n=$((n+1)); done
"""
QUICK = "#!/bin/sh\nsleep 1\n"


@pytest.fixture(scope="module")
def lab():
    need_tools("/usr/bin/python3")
    with LAB.running("jf1", "127.0.0.43",
                     f"  poll_interval: {POLL_S}\n  node_grace: 600\n  admins: []\n",
                     fake_gpus=4,   # a GPU each for alice's jobs, and one for bob's
                     clean=_kill_all) as ctl:
        yield ctl


def _script(lab, name: str, body: str) -> str:
    path = lab.scripts / name
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def _submit(lab, user: str, script: str, *args: str) -> int:
    out = cli_as(user, lab.home, "queue", "add", script, *args)
    assert out["rc"] == 0, out
    return int(re.search(r"\b(\d+)\b", out["out"]).group(1))


def _job(lab, job_id: int) -> dict:
    return jobs_by_id(lab.home)[job_id]


def _processes_of(user: str) -> list[int]:
    """pids of the processes running as ``user`` (real uid) now."""
    import pwd
    uid = str(pwd.getpwnam(user).pw_uid)
    found = []
    for status in proc_files("status"):
        try:
            uids = next(ln for ln in status.read_text().splitlines() if ln.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if uids.split()[1] == uid:
            found.append(int(status.parent.name))
    return found


def _kill_all(user: str) -> None:
    """End what this module's test accounts still run (a failed test's jobs)."""
    for pid in _processes_of(user):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until(lambda: _processes_of(user) == [], limit=120)


def _quick_start_delays(lab, count: int) -> list[float]:
    """Bob's one-second jobs, one after another: how long each waited to start."""
    delays = []
    for i in range(count):
        job_id = _submit(lab, BOB, _script(lab, f"quick{i}.sh", QUICK))

        def started(job_id: int = job_id) -> dict | None:
            job = _job(lab, job_id)
            return job if job["started_at"] else None
        job = wait_until(started, limit=120)
        delays.append(job["started_at"] - job["submitted_at"])
        wait_until(lambda job_id=job_id: _job(lab, job_id)["state"] == "succeeded", limit=120)
    return delays


def test_a_progress_file_swapped_with_a_fifo_delays_no_one(lab):
    home = Path(f"/home/{ALICE}")
    swapper = _submit(lab, ALICE, _script(lab, "swap", SWAPPER))
    wait_until(lambda: _job(lab, swapper)["state"] == "running", limit=120)
    # the swaps go on long enough for several rounds to read the file mid-swap
    wait_until(lambda: int((home / f"jf-swaps-{swapper}").read_text() or 0) >= 1000,
               limit=120)
    delays = _quick_start_delays(lab, 3)
    assert max(delays) <= 2 * POLL_S, delays
    (home / f"jf-stop-{swapper}").touch()
    wait_until(lambda: _job(lab, swapper)["state"] == "succeeded", limit=120)
    # nothing of alice's is left on the node: no reader blocked on the FIFO
    wait_until(lambda: _processes_of(ALICE) == [], limit=120)


def test_a_fifo_exit_file_neither_keeps_a_job_running_nor_stops_its_cancel(lab):
    home = Path(f"/home/{ALICE}")
    ended = _submit(lab, ALICE, _script(lab, "fifo-exit", FIFO_EXIT), "end")
    waiting = _submit(lab, ALICE, _script(lab, "fifo-exit", FIFO_EXIT))
    wait_until(lambda: (home / f"jf-ready-{waiting}").exists()
               and _job(lab, waiting)["state"] == "running", limit=120)
    # the job that ended: over, without an exit code (there was none to read)
    job = wait_until(lambda: _job(lab, ended)["state"] == "failed" and _job(lab, ended),
                     limit=120)
    assert job["exit_code"] is None, job
    # the one still running: cancelled by its owner; its cancel cannot write the exit code
    assert cli_as(ALICE, lab.home, "queue", "cancel", str(waiting))["rc"] == 0
    wait_until(lambda: _job(lab, waiting)["state"] == "cancelled", limit=120)
    # the node's data stays fresh: another member's job starts within two poll intervals
    assert max(_quick_start_delays(lab, 2)) <= 2 * POLL_S
    wait_until(lambda: _processes_of(ALICE) == [], limit=120)

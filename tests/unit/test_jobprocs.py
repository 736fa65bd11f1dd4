"""The tests' own job cleanup (helpers.jobprocs) signals a job only while its recorded pid is
still that job: a reused pid belongs to someone else (another test's sshd connection once)."""
import os
import signal
import subprocess
from pathlib import Path

from helpers.jobprocs import kill_recorded_jobs, recorded_leader


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]


def test_a_pid_is_believed_only_with_its_start_time_or_the_jobs_own_environment(tmp_path):
    job = tmp_path / "jobs" / "7"
    job.mkdir(parents=True)
    env = {**os.environ, "IADEEP_PROGRESS_FILE": f"{job}/progress"}
    mine = subprocess.Popen(["sleep", "60"], start_new_session=True, env=env)
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        pid_file = job / "pid"
        pid_file.write_text(f"{mine.pid} {_start_time(mine.pid)}\n")
        assert recorded_leader(pid_file) == mine.pid
        pid_file.write_text(f"{stranger.pid} {int(_start_time(stranger.pid)) + 1}\n")
        assert recorded_leader(pid_file) is None          # the pid reused: not the job
        pid_file.write_text(f"{stranger.pid}\n")
        assert recorded_leader(pid_file) is None          # no time, not the job's environment
        pid_file.write_text(f"{mine.pid}\n")
        assert recorded_leader(pid_file) == mine.pid      # no time, the job's environment
        assert kill_recorded_jobs([pid_file, tmp_path / "missing"]) == [mine.pid]
        assert mine.wait(timeout=10) == -signal.SIGKILL
        assert stranger.poll() is None
    finally:
        for p in (mine, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()

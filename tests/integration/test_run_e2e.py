"""`iadeep run -- COMMAND`, end to end: real sshd nodes, a real controller, the real CLI as a
process whose output is read as it comes, signalled as a terminal would."""
import os
import pty
import signal
import subprocess
from pathlib import Path

import pytest

from helpers.controllers import (
    IADEEP,
    attempt_processes,
    env_for,
    fake_gpu_lab,
    jobs_by_id,
    kill_attempt,
    wait_jobs,
    wait_until,
)

FINISHED = {"succeeded", "failed", "cancelled", "timeout"}


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path) as ctl:
        yield ctl


class Client:
    """`iadeep run ARGS...` running in the background; its stdout and stderr go to files that
    the test reads while it runs."""

    def __init__(self, home: Path, tmp_path: Path, name: str, *args: str):
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([*IADEEP, "run", *args], env=env_for(home),
                                         stdout=out, stderr=err)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait(self) -> int:
        return self.proc.wait(timeout=240)

    def job_id(self) -> int:
        line = next(x for x in self.stderr().splitlines() if x.endswith(" submitted"))
        return int(line.split()[3])


def _gate(tmp_path: Path, name: str) -> tuple[Path, str]:
    """A file the test creates to let the command go on, and the sh that waits for it."""
    gate = tmp_path / name
    return gate, f"while [ ! -e {gate} ]; do sleep 0.1; done"


def test_run_streams_output_as_it_comes_and_exits_with_the_commands_status(lab, tmp_path):
    gate, wait = _gate(tmp_path, "go")
    nasty = "it's $(touch /tmp/run-pwned) `x`; \"q\" *"
    # the command's words reach it exactly: $1 is printed as it was given
    client = Client(lab.home, tmp_path, "a", "--", "sh", "-c",
                    f'echo out; echo err >&2; {wait}; printf "%s\\n" "$1"; exit 3', "sh", nasty)
    # both lines print while the command still runs (it waits for the gate)
    wait_until(lambda: client.stdout() == "out\nerr\n", limit=120)
    assert client.proc.poll() is None
    gate.touch()
    assert client.wait() == 3
    assert client.stdout() == f"out\nerr\n{nasty}\n"
    assert not Path("/tmp/run-pwned").exists()
    job = jobs_by_id(lab.home)[client.job_id()]
    assert (job["state"], job["exit_code"]) == ("failed", 3)
    assert "iadeep run: job" in client.stderr() and "(exit code 3)" in client.stderr()


def test_run_with_error_file_prints_stderr_to_stderr(lab, tmp_path):
    client = Client(lab.home, tmp_path, "e", "--error", "err.txt", "--", "sh", "-c",
                    "echo out; echo err >&2")
    assert client.wait() == 0
    assert client.stdout() == "out\n"
    assert "err\n" in client.stderr()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_ctrl_c_or_a_closed_terminal_cancels_the_job_and_leaves_nothing_on_the_node(
        lab, tmp_path, sig):
    home = lab.home
    client = Client(home, tmp_path, "c", "--", "sh", "-c", "echo started; sleep 600")
    wait_until(lambda: client.stdout() == "started\n", limit=120)
    job_id = client.job_id()
    [node] = lab.cluster.nodes
    assert attempt_processes(job_id, node, home)
    client.proc.send_signal(sig)
    assert client.wait() == 128 + sig
    assert jobs_by_id(home)[job_id]["state"] == "cancelled"
    assert "cancelling job" in client.stderr()
    assert attempt_processes(job_id, node, home) == []


def test_detach_leaves_the_job_running_as_a_batch_job(lab, tmp_path):
    home = lab.home
    gate, wait = _gate(tmp_path, "go")
    client = Client(home, tmp_path, "d", "--detach", "--", "sh", "-c", f"echo on; {wait}")
    wait_until(lambda: client.stdout() == "on\n", limit=120)
    client.proc.send_signal(signal.SIGINT)
    assert client.wait() == 0
    job_id = client.job_id()
    assert f"job {job_id} keeps going as a batch job" in client.stderr()
    assert jobs_by_id(home)[job_id]["state"] == "running"
    gate.touch()
    wait_jobs(home, lambda js: js[job_id]["state"] == "succeeded")


def test_on_a_terminal_the_waiting_line_is_rewritten_in_place(lab, tmp_path):
    home = lab.home
    gate, wait = _gate(tmp_path, "first-done")
    first = Client(home, tmp_path, "1", "--exclusive", "--", "sh", "-c", f"echo one; {wait}")
    wait_until(lambda: first.stdout() == "one\n", limit=120)
    master, slave = pty.openpty()
    second = subprocess.Popen([*IADEEP, "run", "--exclusive", "--", "true"],
                              env=env_for(home), stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    os.set_blocking(master, False)   # nothing to read yet: BlockingIOError, "not yet"
    seen = b""

    def shown():
        nonlocal seen
        seen += os.read(master, 4096)
        return b"\r\x1b[Kjob " in seen and b" queued: #1 of 1 waiting: " in seen

    wait_until(shown, limit=120)
    assert b"queued: #1 of 1 waiting: " in seen.split(b"\r\x1b[K")[-1]   # on one line
    gate.touch()
    assert second.wait(timeout=240) == 0 and first.wait() == 0
    os.close(master)


def test_second_run_waits_with_its_reason_then_starts_when_the_first_ends(lab, tmp_path):
    home = lab.home
    gate, wait = _gate(tmp_path, "first-done")
    first = Client(home, tmp_path, "1", "--exclusive", "--", "sh", "-c", f"echo one; {wait}")
    wait_until(lambda: first.stdout() == "one\n", limit=120)
    second = Client(home, tmp_path, "2", "--exclusive", "--", "echo", "two")
    # not a terminal: a line per change of its place or reason
    wait_until(lambda: "queued: #1 of 1 waiting: " in second.stderr(), limit=120)
    assert second.proc.poll() is None and second.stdout() == ""
    gate.touch()
    assert first.wait() == 0 and second.wait() == 0
    assert second.stdout() == "two\n"


def test_sigkilled_controller_during_a_run_neither_loses_nor_doubles_the_job(lab, tmp_path):
    home = lab.home
    gate, wait = _gate(tmp_path, "go")
    marks = tmp_path / "starts"
    client = Client(home, tmp_path, "k", "--", "sh", "-c",
                    f"echo $IADEEP_JOB_ID >> {marks}; echo begun; {wait}; echo done")
    wait_until(lambda: client.stdout() == "begun\n", limit=120)
    lab.kill(signal.SIGKILL)
    wait_until(lambda: "the controller is not answering" in client.stderr(), limit=60)
    assert client.proc.poll() is None
    lab.start()
    gate.touch()
    assert client.wait() == 0
    assert client.stdout() == "begun\ndone\n"
    assert "the controller answers again" in client.stderr()
    jobs = wait_jobs(home, lambda js: all(j["state"] in FINISHED for j in js.values()))
    assert len(jobs) == 1 and marks.read_text().split() == [str(client.job_id())]


def test_a_job_run_again_after_its_node_was_lost_prints_its_new_output_from_the_start(
        lab, tmp_path):
    home = lab.home
    tried = tmp_path / "tried"
    client = Client(home, tmp_path, "r", "--retries", "1", "--", "sh", "-c",
                    f"if [ -e {tried} ]; then echo second try; exit 0; fi; touch {tried}; "
                    "echo first; sleep 600")
    wait_until(lambda: client.stdout() == "first\n", limit=120)
    job_id = client.job_id()
    [node] = lab.cluster.nodes
    lab.cluster.stop(node)                        # the node goes silent...
    wait_jobs(home, lambda js: js[job_id]["state"] == "lost", timeout=60)
    kill_attempt(job_id, node, home)              # ...it reboots: the attempt is gone...
    lab.cluster.start(node)                       # ...and it answers: requeued, run again
    assert client.wait() == 0, client.stderr()
    assert client.stdout() == "first\nsecond try\n"
    assert f"job {job_id} started again (attempt 2)" in client.stderr()

"""`iadeep run --pty COMMAND`, end to end: real sshd nodes, a real controller, the real CLI on a
real pseudo-terminal that the test types into and reads, as a person at a terminal would."""
import os
import pty
import subprocess

import pytest

from helpers.controllers import (
    IADEEP,
    cli,
    env_for,
    fake_gpu_lab,
    jobs_by_id,
    queue_add,
    wait_jobs,
    wait_until,
)


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, gpus=2,
                      lab="node_grace: 3\ninteractive_time_limit: 2h") as ctl:
        yield ctl


class Terminal:
    """A client on a pseudo-terminal of its own (a session leader whose controlling terminal
    it is, as in a terminal window): ``type`` keys, read ``screen``."""

    def __init__(self, home, *args: str):
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([*IADEEP, "run", *args],
                                     env={**env_for(home), "TERM": "xterm"},
                                     stdin=slave, stdout=slave, stderr=slave,
                                     start_new_session=True)
        os.close(slave)
        os.set_blocking(self.master, False)
        self.seen = b""

    def screen(self) -> str:
        try:
            self.seen += os.read(self.master, 65536)
        except (BlockingIOError, OSError):   # nothing new yet; or the client has gone
            pass
        return self.seen.decode(errors="replace")

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> None:
        os.close(self.master)


def _job(home) -> dict:
    [job] = list(jobs_by_id(home).values())
    return job


def test_pty_gives_the_command_a_terminal_keys_and_ctrl_c_reach_it_and_exit_ends_the_job(
        lab, tmp_path):
    home = lab.home
    term = Terminal(home, "--pty", "sh")
    try:
        wait_jobs(home, lambda js: any(j["state"] == "running" for j in js.values()))
        job = _job(home)
        assert job["time_limit_s"] == 7200   # the lab's interactive_time_limit
        # a shell on a terminal: its stdin is one ([ -t 0 ]), it sees its GPU
        term.type(b"[ -t 0 ] && echo on-a-$((6*7))-tty; echo gpu=$CUDA_VISIBLE_DEVICES\r")
        wait_until(lambda: "on-a-42-tty" in term.screen() and "gpu=0" in term.screen(),
                   limit=120)
        # Ctrl-C interrupts the remote command, not this client, and the job goes on
        term.type(b"sleep 300; echo slept-$((1+1))\r")
        wait_until(lambda: "sleep 300" in term.screen(), limit=120)
        term.type(b"\x03")
        # (keys typed with it would be flushed with the interrupt, as on any terminal)
        wait_until(lambda: "^C" in term.screen(), limit=120)
        term.type(b"echo after-$((2+2))-interrupt\r")
        wait_until(lambda: "after-4-interrupt" in term.screen(), limit=120)
        assert "slept-2" not in term.screen()
        assert term.proc.poll() is None and _job(home)["state"] == "running"
        # exit ends the shell, the job (succeeded) and the client (with the shell's status)
        term.type(b"exit\r")
        assert term.proc.wait(timeout=240) == 0
        wait_jobs(home, lambda js: all(j["state"] == "succeeded" for j in js.values()))
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
        term.close()


def test_only_the_owner_types_into_a_running_interactive_job(lab, tmp_path, monkeypatch):
    """The input request's rules, through the real socket: not a batch job's, not after it
    ended (nobody reads its terminal), and `queue rerun` refuses it (nobody would type)."""
    home = lab.home
    batch = queue_add(home, "--", "/bin/sleep", "600")
    term = Terminal(home, "--pty", "sh")
    try:
        wait_jobs(home, lambda js: len(js) == 2 and all(j["state"] == "running"
                                                        for j in js.values()))
        from iadeep_cli import messages as m
        from iadeep_cli.controller import client
        from iadeep_cli.errors import InputError, InvalidTransition

        monkeypatch.setenv("IADEEP_HOME", str(home))
        with pytest.raises(InputError, match="is not interactive"):
            client.ask(m.InputRequest(batch, "ZWNobwo="))
        interactive = next(j["id"] for j in jobs_by_id(home).values() if j["id"] != batch)
        term.type(b"exit 5\r")
        assert term.proc.wait(timeout=240) == 5
        wait_jobs(home, lambda js: js[interactive]["state"] == "failed")
        with pytest.raises(InvalidTransition, match="not running"):
            client.ask(m.InputRequest(interactive, "ZWNobwo="))
        again = cli(home, "queue", "rerun", str(interactive))
        assert again.returncode == 1 and "was interactive" in again.stderr
        cli(home, "queue", "cancel", str(batch), check=True)
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
        term.close()


@pytest.fixture
def short_grace_lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, gpus=2,
                      lab="node_grace: 3\ninteractive_time_limit: 2h\n"
                          "interactive_grace: 8s") as ctl:
        yield ctl


def test_a_pty_client_killed_with_sigkill_does_not_leave_its_shell_holding_a_gpu(
        short_grace_lab):
    """The owner's `iadeep run --pty sh` is killed with SIGKILL (it cannot cancel anything):
    the shell, which nobody can type into again, is stopped once the client has not been heard
    from for lab.interactive_grace (8 s here), not at its 2 h time limit; its GPU is free for
    the next job. A live client past that grace keeps its job."""
    home = short_grace_lab.home
    term = Terminal(home, "--pty", "sh")
    try:
        wait_jobs(home, lambda js: any(j["state"] == "running" for j in js.values()))
        job = _job(home)["id"]
        term.type(b"sleep 12; echo slept-$((5+5))-s\r")   # longer than the grace, client alive
        wait_until(lambda: "slept-10-s" in term.screen(), limit=120)
        assert _job(home)["state"] == "running"
        term.proc.kill()                                   # SIGKILL: no cancel is sent
        term.proc.wait(timeout=30)
        ended = wait_jobs(home, lambda js: js[job]["state"] == "cancelled", timeout=120)[job]
        assert "run --pty` client had gone" in ended["reason"], ended
        shown = cli(home, "queue", "show", str(job), check=True).stdout
        assert "cancelled: its `iadeep run --pty` client had gone" in shown   # its event
        follower = queue_add(home, "--gpus", "2", "--", "/bin/true")   # both GPUs are free
        wait_jobs(home, lambda js: js[follower]["state"] == "succeeded", timeout=120)
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
        term.close()

"""`iadeep run --pty`'s rules in the controller (requests/interactive.py) and its job script
(cli/runpty.py); end to end with a real terminal: tests/integration/test_run_pty_e2e.py."""
import base64
import subprocess
import time

import pytest

from iadeep_cli import messages as m
from iadeep_cli.cli.runpty import pty_script
from iadeep_cli.controller.requests import interactive
from iadeep_cli.errors import InputError, InvalidTransition, PermissionDenied
from iadeep_cli.jobs import MAX_INPUT, Job, JobSpec, JobState
from iadeep_cli.settings import BackendKind, Node


def _job(state=JobState.RUNNING, interactive_=True, owner="alice") -> Job:
    return Job(7, owner, JobSpec("/x/run.sh", interactive=interactive_), state, time.time(),
               node="n1", gpu_indices=(0,))


def _req(data: bytes) -> m.InputRequest:
    return m.InputRequest(7, base64.b64encode(data).decode())


def test_only_nodes_that_give_a_terminal_may_take_an_interactive_job():
    ssh, slurm = Node("n1", "h1"), Node("s1", "h2", backend=BackendKind.SLURM)
    interactive.check_nodes([ssh])   # fine
    with pytest.raises(InputError, match="Slurm node") as err:
        interactive.check_nodes([ssh, slurm])
    assert err.value.hint == "add --nodelist n1"
    with pytest.raises(InputError, match="Slurm node") as err:
        interactive.check_nodes([slurm])
    assert "srun --pty" in err.value.hint


def test_its_default_time_limit_is_the_labs_within_the_maximum():
    assert interactive.time_limit(8 * 3600, None) == 8 * 3600
    assert interactive.time_limit(8 * 3600, 3600) == 3600


def test_keys_reach_only_the_owners_running_interactive_job():
    written = []

    def writer(job, data):
        written.append((job.id, data))

    assert interactive.write(writer, _job(), "alice", _req(b"ls\r")).state == "running"
    assert written == [(7, b"ls\r")]
    with pytest.raises(PermissionDenied, match="only its owner"):
        interactive.write(writer, _job(), "bob", _req(b"rm -rf ~\r"))
    with pytest.raises(InputError, match="not interactive"):
        interactive.write(writer, _job(interactive_=False), "alice", _req(b"x"))
    with pytest.raises(InvalidTransition, match="not running"):
        interactive.write(writer, _job(JobState.QUEUED), "alice", _req(b"x"))
    with pytest.raises(InputError, match="not base64"):
        interactive.write(writer, _job(), "alice", m.InputRequest(7, "***"))
    assert written == [(7, b"ls\r")]   # none of the refused reached the terminal


def test_input_past_the_bound_is_refused_whole_by_the_nodes_backend():
    """The controller leaves the size of what is typed at once to the backend
    (``Backend.write_input``; tests/integration/test_backend_contract.py): the shell backend's
    one-line error reaches the client as it is, and nothing reaches the node."""
    from iadeep_cli.nodes.shell import backend as shell

    def writer(job, data):   # no node pool: the refusal comes before any remote command
        shell.write_input(None, job.node, job, data)  # type: ignore[arg-type]

    with pytest.raises(InputError) as err:
        interactive.write(writer, _job(), "alice", _req(b"x" * (MAX_INPUT + 1)))
    assert err.value.message == f"at most {MAX_INPUT} bytes of input at once, got {MAX_INPUT + 1}"


def test_the_job_script_runs_the_command_exactly_and_its_shell_back(tmp_path):
    """The words reach the command as typed (quoted for sh twice: the script and script -c),
    the terminal type is never a way into the script, and the command gets its $SHELL."""
    nasty = "it's $(touch pwned) `x`; \"q\""
    body = pty_script(["sh", "-c", 'printf "%s|%s\\n" "$1" "$SHELL"', "sh", nasty], 30, 100,
                      "xterm; touch pwned2").decode()
    assert "touch pwned2" not in body and "TERM=xterm; export TERM\n" in body
    (tmp_path / "run.sh").write_text(body)
    fifo_dir = tmp_path / "job"
    fifo_dir.mkdir()
    done = subprocess.run(["sh", str(tmp_path / "run.sh")], cwd=tmp_path, capture_output=True,
                          env={"PATH": "/usr/bin:/bin", "SHELL": "/bin/bash",
                               "IADEEP_PROGRESS_FILE": f"{fifo_dir}/progress"}, timeout=60)
    assert done.returncode == 0, done
    assert f"{nasty}|/bin/bash" in done.stdout.decode()
    assert (fifo_dir / "tty-in").is_fifo()
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()

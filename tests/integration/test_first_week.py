"""What a lab's first week trips over in the CLI, each a one-line fix: real `iadeep` processes,
a real controller (its one node never answers, so jobs stay queued)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers.controllers import IADEEP, cli, controller_on


@pytest.fixture
def queued(tmp_path):
    """A controller whose one node never answers: a job it accepts stays queued."""
    ctl = controller_on(tmp_path, "[{name: gone, host: 127.0.0.1, port: 9}]")
    yield ctl
    ctl.stop()


def _script(tmp_path, body: bytes, name: str = "job.sh"):
    path = tmp_path / name
    path.write_bytes(body)
    path.chmod(0o755)
    return str(path)


def _one_line(proc, code: int, *fragments: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def member():
    """A member's HOME, short enough for a socket path below it (pytest's are not, under
    xdist)."""
    home = Path(tempfile.mkdtemp(prefix="iadeep-m-", dir="/tmp"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _without_iadeep_home(home, *args: str) -> subprocess.CompletedProcess:
    """`iadeep ARGS` as a member who never set IADEEP_HOME: their own default directory."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("IADEEP_") and k != "XDG_STATE_HOME"}
    env["HOME"] = str(home)
    return subprocess.run([*IADEEP, *args], env=env, capture_output=True, text=True, timeout=120)


def test_a_member_without_iadeep_home_is_told_to_set_it(tmp_path, member):
    status = _without_iadeep_home(member, "status")
    assert status.returncode == 0, status.stderr
    assert "set IADEEP_HOME to your lab's state directory (ask your admin)" in status.stdout
    assert "never run" not in status.stdout
    add = _without_iadeep_home(member, "queue", "add", _script(tmp_path, b"#!/bin/sh\n"))
    line = _one_line(add, 1, "IADEEP_HOME is not set",
                     "set IADEEP_HOME to your lab's state directory (ask your admin)")
    assert str(member / ".local/state/iadeep") in line


def test_version(tmp_path):
    from iadeep_cli import __version__

    out = cli(tmp_path, "--version")
    assert out.returncode == 0 and out.stdout == f"iadeep {__version__}\n", out


def test_logs_of_a_queued_job_say_it_has_not_started(queued, tmp_path):
    job = cli(queued.home, "queue", "add", _script(tmp_path, b"#!/bin/sh\necho hi\n"),
              check=True).stdout.strip()
    _one_line(cli(queued.home, "logs", job), 1, f"job {job} has not started yet (queued)",
              f"iadeep queue why {job}")


def test_an_unknown_option_says_script_options_go_after_double_dash(tmp_path):
    script = _script(tmp_path, b"#!/bin/sh\n")
    _one_line(cli(tmp_path, "queue", "add", script, "--lr", "0.1"), 2, "no such option: --lr",
              "options meant for the script go after `--`: iadeep queue add SCRIPT -- --lr")


def test_where_the_lab_chose_warn_sbatch_lines_get_a_warning_naming_the_equivalent(
        queued, tmp_path):
    script = _script(tmp_path, b"#!/bin/sh\n#SBATCH --gres=gpu:2\n#SBATCH -t 1:00:00\n"
                               b"#SBATCH -e err.txt\n#SBATCH --mem=32G\necho hi\n")
    out = cli(queued.home, "queue", "add", script, check=True, IADEEP_SBATCH="warn")
    assert out.stdout.strip().isdigit()
    warning = out.stderr.strip()
    assert warning.startswith(f"warning: {script} has #SBATCH lines, which iadeep does not read")
    for said in ("line 2: #IADEEP --gpus 2", "line 3: #IADEEP --time 1:00:00",
                 "line 4: #IADEEP --error err.txt", "line 5: no equivalent for --mem=32G"):
        assert said in warning, warning
    mixed = _script(tmp_path, b"#!/bin/sh\n#IADEEP --gpus 1\n#SBATCH -t 5\n", "mixed.sh")
    assert "#SBATCH" not in cli(queued.home, "queue", "add", mixed, check=True,
                                IADEEP_SBATCH="warn").stderr


def test_crlf_in_the_hashbang_line_is_refused_with_the_fix(tmp_path):
    script = _script(tmp_path, b"#!/bin/sh\r\necho hi\r\n")
    _one_line(cli(tmp_path, "queue", "add", script), 1, f"{script}: its #! line ends in a "
              "carriage return (Windows line endings)", "sed -i", "dos2unix")


def test_an_unclosed_quote_on_an_iadeep_line_names_the_file(tmp_path):
    script = _script(tmp_path, b"#!/bin/sh\n#IADEEP --name 'oops\necho hi\n")
    _one_line(cli(tmp_path, "queue", "add", script), 1, f"{script}: line 2: #IADEEP --name",
              "quote #IADEEP values")


def test_nodes_trust_refuses_to_record_where_no_controller_reads(tmp_path, member):
    """`sudo -u iadeep -H iadeep nodes trust gpu1 --inventory ...` (no IADEEP_HOME): the key
    would go to the account's own default directory, which the lab's controller never reads."""
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("nodes: [{name: gpu1, host: 127.0.0.1, port: 9}]\n")
    out = _without_iadeep_home(member, "nodes", "trust", "gpu1", "--inventory", str(inventory),
                               "--yes")
    line = _one_line(out, 1, "IADEEP_HOME is not set, and no controller uses this account's "
                     "default state directory", "sudo -u iadeep sh -lc 'iadeep nodes trust gpu1'")
    assert not (member / ".local/state/iadeep/known_hosts").exists(), line
    # a controller of one's own (its inventory in the default directory) is trusted as before
    own = member / ".local/state/iadeep"
    own.mkdir(parents=True)
    (own / "nodes.yaml").write_text(inventory.read_text())
    out = _without_iadeep_home(member, "nodes", "trust", "gpu1", "--yes")
    assert "IADEEP_HOME is not set" not in out.stderr and "gpu1" in out.stderr, out.stderr


def test_a_state_directory_too_deep_for_a_socket_is_one_line_not_a_traceback(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    out = cli(deep, "queue", "add", _script(tmp_path, b"#!/bin/sh\n"))
    _one_line(out, 1, "is too long for a Unix socket", "use a shorter state directory")

"""`iadeep logs` end to end: a real controller reads a multi-MB log from a real sshd node.

By default the end of the log (where the error is) with a note on stderr; --head/--tail N
lines; --all the whole log, byte for byte, in bounded chunks (UTF-8 cut at no chunk boundary).
"""
from __future__ import annotations

import json
import os
import pty
import sqlite3
import subprocess
from pathlib import Path

import pytest

from helpers.controllers import (
    IADEEP,
    ControllerProcess,
    cli,
    env_for,
    jobs_by_id,
    queue_add,
    wait_until,
)

pytestmark = pytest.mark.sshd

LINES = 150_000
LINE = "step {:06d} loss 0.123 é€😀 padding padding padding padding padding padding"
ERROR = "Traceback (most recent call last): the error is here, at the end"
SCRIPT = f"""#!/bin/sh
seq -f '{LINE.replace("{:06d}", "%06g")}' 1 {LINES}
echo '{ERROR}' >&2
exit 1
"""


def log_file(lab, job: int) -> Path:
    """The job's log on the test node (the node's workdir is on this machine)."""
    db = sqlite3.connect(lab.home / "iadeep.db")
    install_id = json.loads(db.execute("SELECT value FROM meta WHERE key='install_id'")
                            .fetchone()[0])
    db.close()
    return Path(lab.cluster.workdir) / install_id / "node01" / "jobs" / str(job) / "log"


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    cluster = sshd_cluster(1)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n" + cluster.inventory_yaml())
    ctl = ControllerProcess(tmp_path / "state", inventory).start()
    ctl.cluster = cluster
    yield ctl
    ctl.stop()


def test_a_multi_megabyte_log(lab, tmp_path):
    script = tmp_path / "long.sh"
    script.write_text(SCRIPT)
    home = lab.home
    job = queue_add(home, str(script))
    wait_until(lambda: jobs_by_id(home)[job]["state"] == "failed", limit=120)
    whole = log_file(lab, job).read_bytes()
    lines = [LINE.format(i) + "\n" for i in range(1, LINES + 1)] + [ERROR + "\n"]
    assert whole.decode() == "".join(lines) and len(whole) > 10 * 2 ** 20

    default = cli(home, "logs", str(job), check=True)
    assert default.stdout == "".join(lines[-100:])           # ends with the error
    note = default.stderr.strip()
    assert note.startswith("note: ") and "\n" not in note and f"logs {job} --all" in note

    assert cli(home, "logs", str(job), "--tail", "3", check=True).stdout == "".join(lines[-3:])
    assert cli(home, "logs", str(job), "--head", "2", check=True).stdout == "".join(lines[:2])
    many = cli(home, "logs", str(job), "--tail", "120000", check=True)   # ~9 MB back
    assert many.stdout == "".join(lines[-120_000:]) and many.stderr == ""
    assert cli(home, "logs", str(job), "--tail", "0", check=True).stdout == ""
    everything = cli(home, "logs", str(job), "--all", check=True)
    assert everything.stdout.encode() == whole and everything.stderr == ""
    follow = cli(home, "logs", str(job), "--tail", "1", "--follow", check=True)
    assert follow.stdout == lines[-1]                        # the job has ended: no waiting


def test_a_log_of_one_long_line_still_shows_its_end(lab, tmp_path):
    script = tmp_path / "bar.sh"     # a progress bar: carriage returns, no newline
    script.write_text("#!/bin/sh\ni=0; while [ $i -lt 20000 ]; do printf '\\r%06d' $i; "
                      "i=$((i+1)); done\n")
    job = queue_add(lab.home, str(script))
    wait_until(lambda: jobs_by_id(lab.home)[job]["state"] == "succeeded", limit=120)
    out = cli(lab.home, "logs", str(job), check=True)
    # (text mode reads the carriage returns as newlines)
    assert out.stdout.endswith("019999") and len(out.stdout) == 64 * 1024
    assert "earlier output omitted" in out.stderr
    # the job's log replaced by a FIFO: a one-line error, and the node still answers
    log_file(lab, job).unlink()
    os.mkfifo(log_file(lab, job))
    fifo = cli(lab.home, "logs", str(job))
    assert fifo.returncode == 1 and fifo.stderr.startswith("Error: node node01: ")
    assert "is a FIFO, not a regular file" in fifo.stderr and len(fifo.stderr.splitlines()) == 1
    assert cli(lab.home, "logs", str(job), "--all").returncode == 1
    wait_until(lambda: json.loads(cli(lab.home, "status", "--json", check=True).stdout)
               ["nodes"][0]["error"] is None, limit=60)   # (a slow round's error passes)


# What a member's job writes to take over the terminal of whoever reads its log (an admin).
HOSTILE = (b"epoch 1\n\x1b]52;c;cm0gLXJmIH4vKg==\x07\x1b]0;root@head\x07\x1bPq#dcs\x1b\\"
           b"\x1b[2J\x1b[1;1H\x1b[5Afake: job finished OK\n"
           b"\x1b[32mgreen loss\x1b[0m\tstep 1/2\rstep 2/2\n\x9b2J\xc2\x9b6n done\n")
SHOWN = (b"epoch 1\n\\x1b]52;c;cm0gLXJmIH4vKg==\\x07\\x1b]0;root@head\\x07\\x1bPq#dcs"
         b"\\x1b\\\\x1b[2J\\x1b[1;1H\\x1b[5Afake: job finished OK\n"
         b"\x1b[32mgreen loss\x1b[0m\tstep 1/2\rstep 2/2\n")


def _logs_bytes(home: Path, *args: str, terminal: bool = False) -> bytes:
    """`iadeep logs ARGS` as a real process; its stdout's bytes, from a pipe or a terminal."""
    if not terminal:
        return subprocess.run([*IADEEP, "logs", *args], env=env_for(home), check=True,
                              capture_output=True, timeout=120).stdout
    master, slave = pty.openpty()
    proc = subprocess.Popen([*IADEEP, "logs", *args], env=env_for(home), stdout=slave,
                            stderr=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        try:
            got = os.read(master, 65536)
        except OSError:          # the terminal closed: the command is done
            break
        if not got:
            break
        out += got
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return out.replace(b"\r\n", b"\n")        # the terminal's own newline translation


def test_a_log_with_terminal_escapes_is_printed_inert_and_raw_only_when_asked(lab, tmp_path):
    """A job writes OSC 52 (clipboard), OSC 0 (title), DCS, a screen clear, cursor moves and
    C1 controls: `iadeep logs` shows each of them escaped (on a pipe and on a terminal), keeps
    the colours, tab and carriage return a training log needs, and `--raw` gives the bytes."""
    (tmp_path / "hostile").write_bytes(HOSTILE)
    script = tmp_path / "hostile.sh"
    script.write_text(f"#!/bin/sh\ncat '{tmp_path / 'hostile'}'\n")
    job = queue_add(lab.home, str(script))
    wait_until(lambda: jobs_by_id(lab.home)[job]["state"] == "succeeded", limit=120)
    assert log_file(lab, job).read_bytes() == HOSTILE
    # a lone byte 0x9b is no UTF-8 (the controller reads it as U+FFFD); U+009B (a C1 CSI) is
    # escaped
    c1 = "\ufffd2J\\x9b6n done\n".encode()
    for terminal in (False, True):
        for args in ((str(job),), (str(job), "--all"), (str(job), "--tail", "3", "--follow")):
            out = _logs_bytes(lab.home, *args, terminal=terminal)
            for attack in (b"\x1b]", b"\x1bP", b"\x1b[2J", b"\x1b[1;1H", b"\x1b[5A", b"\x07",
                           b"\xc2\x9b"):
                assert attack not in out, (args, terminal, attack)
            whole = SHOWN + c1
            assert out == (whole if "--tail" not in args else whole.split(b"\n", 1)[1]), out
    raw = _logs_bytes(lab.home, str(job), "--all", "--raw")
    assert raw == HOSTILE.replace(b"\x9b2J", "\ufffd2J".encode())   # (not UTF-8: replaced)


@pytest.mark.parametrize("args, needle", [
    (["--head", "2", "--all"], "--head and --all cannot be combined"),
    (["--tail", "2", "--head", "1"], "--head and --tail cannot be combined"),
    (["--head", "2", "--follow"], "--head and --follow cannot be combined"),
    (["--tail", "-5"], "--tail needs a number of lines >= 0"),
])
def test_conflicting_options_are_one_line_errors(tmp_path, args, needle):
    res = cli(tmp_path, "logs", "1", *args)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.startswith("Error: ") and needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_status_json_from_a_real_controller_is_standard(lab):
    lab.cluster.node("node01").set_fake(mode="hostile")
    def polled():
        out = cli(lab.home, "status", "--json", check=True).stdout
        node = json.loads(out, parse_constant=lambda t: pytest.fail(f"non-standard {t}"))
        if not node["nodes"]:       # the controller's first poll round has not ended yet
            return None
        gpus = node["nodes"][0]["gpus"]
        return gpus and gpus[0]["name"] == "NVIDIA H200?[2J" and gpus
    (gpu,) = wait_until(polled, limit=120)
    assert gpu["utilization_gpu"] is None and gpu["memory_total_mib"] == 143771


@pytest.mark.parametrize("option, named", [("--output", "its output"),
                                           ("--error", "its error file")])
def test_an_output_file_that_cannot_be_opened_fails_the_job_saying_why(lab, tmp_path, option,
                                                                       named):
    """--output (or --error alone) in a directory that does not exist on the node: the job
    fails before it runs, with the shell's message in its reason naming the file it was
    given, and `iadeep logs` shows the job directory's log."""
    script = tmp_path / "out.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    missing = tmp_path / "no-such-dir"
    job = queue_add(lab.home, str(script), option, f"{missing}/out-%j.txt")
    wait_until(lambda: jobs_by_id(lab.home)[job]["state"] == "failed", limit=120)
    reason = jobs_by_id(lab.home)[job]["reason"]
    assert reason == (f"could not open {named} (exit code 122): cannot create "
                      f"{missing}/out-{job}.txt: Directory nonexistent"), reason
    log = cli(lab.home, "logs", str(job))
    assert log.returncode == 0 and "iadeep: cannot open the job's output: cannot create" in \
        log.stdout and "ran" not in log.stdout, log

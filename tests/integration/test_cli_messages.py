"""What a new lab trips over in the CLI: usage errors, odd paths, long reasons, raw field
values, workload typos, negative priorities. Real `iadeep` processes, a real controller."""
from __future__ import annotations

import itertools
import json
import os
import pty
import subprocess

import pytest

from helpers.controllers import IADEEP, cli, controller_on, env_for, wait_until
from iadeep_cli.text import cells


@pytest.fixture
def unreachable(tmp_path):
    """A controller whose one node never answers (nothing listens on 127.0.0.1:9): a queued
    job waits with a 66-character reason."""
    ctl = controller_on(tmp_path, "[{name: gone, host: 127.0.0.1, port: 9}]")
    yield ctl
    ctl.stop()


def _one_line(proc, code: int, *fragments: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _on_terminal(home, *args: str, columns: int = 100) -> str:
    """Run `iadeep ARGS` with stdout on a pseudo-terminal ``columns`` wide, as at a shell."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([*IADEEP, *args], env=env_for(home, COLUMNS=str(columns)),
                              stdout=slave, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(slave)
    assert proc.returncode == 0, proc.stderr
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:          # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return out.decode().replace("\r\n", "\n")


# --------------------------------------------------------------------------- usage errors
@pytest.mark.parametrize("args, fragments", [
    (("queue", "add"), ("missing argument 'script'", "`iadeep queue add --help`")),
    (("queue", "list", "--usr", "x"), ("no such option: --usr", "did you mean --user?",
                                       "`iadeep queue list --help`")),
    (("queue", "show", "abc"), ("invalid value for 'job_id'", "`iadeep queue show --help`")),
    (("queu", "list"), ("no such command 'queu'", "did you mean 'queue'?", "`iadeep --help`")),
    (("sim", "--jobs"), ("option '--jobs' requires an argument", "--help")),
])
def test_usage_errors_are_one_line_with_exit_2(tmp_path, args, fragments):
    res = cli(tmp_path, *args)
    line = _one_line(res, 2, "(hint: ", *fragments)
    assert "Usage:" not in res.stderr and "╭" not in res.stderr and not res.stdout
    assert line.endswith("--help`)")


def test_top_level_help_wraps_each_description_to_an_80_column_terminal(tmp_path):
    """Every command's line in `iadeep --help` is filled before it wraps (greedy wrapping):
    no description breaks mid-sentence where its docstring's source line happened to end."""
    out = cli(tmp_path, "--help", COLUMNS="80", check=True).stdout
    panel = out[out.index("Commands"):].splitlines()[1:]
    entries: list[list[str]] = []
    width = 0
    for line in panel:
        if not line.startswith("│"):
            break
        inner = line.strip("│")
        width = len(inner) - 1
        name, text = inner[:13].strip(), inner[13:].rstrip()
        if name:
            entries.append([text])
        else:
            entries[-1].append(text)
    assert len(entries) > 10 and max(len(e) for e in entries) > 1, out
    for lines in entries:
        for this, after in itertools.pairwise(lines):
            # the next line's first word would not have fitted on this one
            assert len(this) + 1 + len(after.split()[0]) > width - 13, (this, after)
    assert all(len(line) <= 80 for line in out.splitlines()), out


def test_help_and_a_commands_own_exit_code_still_work(tmp_path):
    assert cli(tmp_path, "queue", "priority", "--help").returncode == 0
    # `queue cancel` exits 1 through typer.Exit when a job fails (here: no controller at all)
    assert cli(tmp_path, "queue", "cancel", "1").returncode == 1


def test_a_path_that_is_not_a_regular_file_says_what_it_is(tmp_path):
    _one_line(cli(tmp_path, "queue", "add", "/dev/null"), 1,
              "script '/dev/null' is not a regular file (a character device)")
    _one_line(cli(tmp_path, "queue", "add", str(tmp_path)), 1, "is a directory")
    _one_line(cli(tmp_path, "queue", "add", str(tmp_path / "nope.sh")), 1, "nope.sh' not found")
    _one_line(cli(tmp_path, "sim", "--trace", "/dev/null"), 1,
              "trace file is not a regular file (a character device)")
    _one_line(cli(tmp_path, "model", "eval", "--profiles", "/dev/null"), 1,
              "/dev/null: is not a regular file")


def test_json_readers_say_on_stderr_that_no_controller_has_ever_run(tmp_path):
    """`queue list --json` in a state directory no controller ever used: stdout stays the
    (empty) JSON a script parses, and stderr says why it is empty, as the table's note does;
    without IADEEP_HOME it says how to find the lab's directory."""
    for argv in (("queue", "list", "--json"), ("profile", "list", "--json")):
        done = cli(tmp_path / "never", *argv)
        assert done.returncode == 0 and isinstance(json.loads(done.stdout), list), done
        assert done.stderr.count("\n") == 1 and "it has never run here" in done.stderr, done
    env = {k: v for k, v in env_for(tmp_path).items() if k != "IADEEP_HOME"}
    env["HOME"] = str(tmp_path / "member")
    done = subprocess.run([*IADEEP, "queue", "list", "--json"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout) == [], done
    assert "never run in your default state directory: set IADEEP_HOME" in done.stderr, done


# --------------------------------------------------------------------------- queue list / show
def test_long_reasons_are_shortened_with_dots_only_on_a_terminal(unreachable, script):
    home = unreachable.home
    cli(home, "queue", "add", str(script), "--name", "n" * 40, check=True)
    reason = wait_until(lambda: json.loads(cli(home, "queue", "list", "--json").stdout)[0]
                        ["reason"], limit=60)
    piped = cli(home, "queue", "list", check=True).stdout
    assert piped.rstrip().endswith(reason) and "n" * 40 in piped       # nothing cut in a pipe
    lines = {}
    for columns in (100, 80):                  # the other columns take ~38
        line = lines[columns] = _on_terminal(home, "queue", "list", columns=columns).splitlines()[1]
        cut = line.rsplit("  ", 1)[1]
        assert cut.endswith("...") and reason.startswith(cut[:-3])
        assert len(line) == columns                             # fills the line, never wraps
    assert "n" * 25 + "..." in lines[100] and "n" * 26 not in lines[100]   # NAME: 28 first,
    assert len(lines[80].rsplit("  ", 1)[1]) == 20              # then REASON down to 20,
    assert "n" * 25 not in lines[80] and "n..." in lines[80]    # then NAME again
    wide = _on_terminal(home, "queue", "list", columns=200).splitlines()[1]
    assert reason in wide and "n" * 40 in wide                  # a wide terminal cuts nothing
    wide = _on_terminal(home, "queue", "list", "--wide")
    assert reason in wide and "n" * 40 in wide


def test_queue_list_keeps_one_line_a_job_at_80_columns_when_jobs_have_a_time_limit(
        tmp_path, script):
    """The example inventory gives every job a time limit, which adds the TIME column; the
    rows must still fit an 80-column terminal, whatever the user's and job's names."""
    ctl = controller_on(tmp_path, "[{name: gone, host: 127.0.0.1, port: 9}]",
                        lab="default_time_limit: 1d")
    try:
        home = ctl.home
        cli(home, "queue", "add", str(script), "--name", "train-" + "x" * 30, check=True)
        cli(home, "queue", "add", str(script), "--name", "eval", "--time", "2-12:30:00",
            check=True)
        wait_until(lambda: all(j["reason"] for j in
                               json.loads(cli(home, "queue", "list", "--json").stdout)), 60)
        lines = _on_terminal(home, "queue", "list", columns=80).splitlines()
        assert lines[0].split()[-2:] == ["TIME", "REASON"], lines
        assert len(lines) == 3 and all(len(line) <= 80 for line in lines), lines
        assert "-/1d0h" in lines[1] and "-/2d12h" in lines[2], lines
    finally:
        ctl.stop()


def test_cjk_job_names_keep_the_columns_aligned_in_display_cells(unreachable, script):
    """A job named in Chinese takes two terminal cells a character: the columns after NAME
    start at the same cell on every line, on a pipe and cut to fit a terminal."""
    home = unreachable.home
    for name in ("训练模型-大", "train", "ﾃｽﾄ-half-width"):
        cli(home, "queue", "add", str(script), "--name", name, check=True)
    jobs = wait_until(lambda: (js := json.loads(cli(home, "queue", "list", "--json").stdout))
                      and all(j["reason"] for j in js) and js, 60)
    owner = jobs[0]["user"]

    def user_column_cells(text: str) -> set[int]:   # where USER begins, in cells
        return {cells(line[:line.index(f" {owner} ")
                          if not line.startswith("ID") else line.index(" USER ")])
                for line in text.splitlines()}
    assert len(user_column_cells(cli(home, "queue", "list", check=True).stdout)) == 1
    narrow = _on_terminal(home, "queue", "list", columns=60)
    assert len(user_column_cells(narrow)) == 1, narrow
    assert all(cells(line) <= 60 for line in narrow.splitlines()), narrow


def test_queue_why_names_an_arrays_task_as_the_user_did(unreachable, script):
    home = unreachable.home
    array = int(cli(home, "queue", "add", str(script), "--array", "0-2", check=True)
                .stdout.split()[0])
    tasks = {j["array_index"]: j["id"] for j in
             json.loads(cli(home, "queue", "list", "--json").stdout)}
    said = cli(home, "queue", "why", f"{array}_1", check=True).stdout
    assert said.startswith(f"job {array}_1 (id {tasks[1]}) is queued"), said
    said = cli(home, "queue", "why", str(tasks[2]), check=True).stdout
    assert said.startswith(f"job {tasks[2]} (task {array}_2) is queued"), said


def test_show_prints_values_as_people_read_them(controller, script):
    home = controller.home
    job = cli(home, "queue", "add", str(script), "a b", "--gpu-mem", "7.123456789", "--exclusive",
              "--env", "X=1 2", "--", "--lr", "3", check=True).stdout.strip()
    fields = dict(line.split(": ", 1) for line in
                  cli(home, "queue", "show", job, check=True).stdout.split("events:")[0]
                  .strip().splitlines())
    fields = {k.strip(): v for k, v in fields.items()}
    assert fields["exclusive"] == "yes" and fields["mem_gib"] == "7.12"
    assert fields["node"] == fields["remote_pid"] == fields["gpu_indices"] == "-"
    assert fields["observed_speed"] == "-" and fields["workdir"] == "-"
    assert fields["args"] == "'a b' --lr 3" and fields["env"] == "X='1 2'"
    assert not {"None", "False", "True", "[]", "{}"} & set(fields.values())


# --------------------------------------------------------------------------- queue add / priority
def test_a_workload_close_to_a_known_one_is_refused_unless_new(controller, script):
    home = controller.home
    _one_line(cli(home, "queue", "add", str(script), "--workload", "resnet-50"), 1,
              "unknown workload 'resnet-50'; did you mean 'resnet50'?", "--new-workload")
    assert json.loads(cli(home, "queue", "list", "--json").stdout) == []   # nothing accepted
    new = cli(home, "queue", "add", str(script), "--workload", "resnet-50", "--new-workload",
              check=True).stdout.strip()
    unlike = cli(home, "queue", "add", str(script), "--workload", "mynet", check=True)
    known = cli(home, "queue", "add", str(script), "--workload", "resnet50", check=True)
    labels = {r["id"]: r["workload"] for r in
              json.loads(cli(home, "queue", "list", "--json").stdout)}
    assert labels == {int(new): "resnet-50", int(unlike.stdout): "mynet",
                      int(known.stdout): "resnet50"}


def test_negative_priorities_need_no_double_dash(controller, script):
    home = controller.home
    job = cli(home, "queue", "add", str(script), "--priority", "-3", check=True).stdout.strip()
    assert cli(home, "queue", "priority", job, "-5", check=True).stdout.strip() == \
        f"job {job}: priority -5"
    assert json.loads(cli(home, "queue", "show", job, "--json").stdout)["priority"] == -5
    _one_line(cli(home, "queue", "priority", job, "--high"), 2, "invalid value for 'value'")

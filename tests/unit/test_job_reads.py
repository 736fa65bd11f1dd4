"""The job part of a poll (``shell/jobstate.state_script``) run by a real ``sh`` over real job
directories: a job shapes its own files as it likes (FIFOs, links, junk), and the poll neither
blocks on them nor believes more than they can honestly say."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from iadeep_cli.errors import NodeError
from iadeep_cli.nodes.gpu import PROGRESS_MAX, split_sections
from iadeep_cli.nodes.local import LocalConnection, run_bounded
from iadeep_cli.nodes.shell.jobstate import (
    parse_poll,
    parse_progress,
    parse_states,
    state_script,
    user_states,
)
from iadeep_cli.settings import Node


@pytest.fixture
def leaders():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _job(workdir: Path, job_id: int, leaders: list | None = None) -> Path:
    """A job directory; with ``leaders``, a live session leader recorded in its pid file."""
    d = workdir / "jobs" / str(job_id)
    d.mkdir(parents=True)
    if leaders is not None:
        p = subprocess.Popen(["sleep", "600"], start_new_session=True)
        leaders.append(p)
        (d / "pid").write_text(f"{p.pid}\n")
    return d


def _run(script: str, limit: float = 30.0) -> dict:
    """The script's sections (it must end by itself well within ``limit``)."""
    _, out, _ = run_bounded(["sh", "-c", script], limit)
    return split_sections(out.decode())


def test_a_fifo_exit_file_is_no_exit_code_and_blocks_nothing(tmp_path):
    d = _job(tmp_path, 1)
    (d / "pid").write_text("999999\n")      # the leader is gone
    os.mkfifo(d / "exit")
    sec = _run(state_script(str(tmp_path), [(1, None, None)]))
    assert [(j, s.state, s.pid, s.exit_code) for j, s in parse_states(sec["state"][1])] == \
        [(1, "exited", 999999, None)]


def test_a_fifo_or_link_pid_file_is_no_pid(tmp_path):
    os.mkfifo(_job(tmp_path, 1) / "pid")        # (no claim either: never launched)
    (_job(tmp_path, 2) / "pid").symlink_to("/proc/self/stat")
    sec = _run(state_script(str(tmp_path), [(1, None, None), (2, None, None)]))
    assert [(j, s.state, s.pid) for j, s in parse_states(sec["state"][1])] == \
        [(1, "missing", None), (2, "exited", None)]


def test_progress_is_read_from_the_offset_with_the_state(tmp_path, leaders):
    d = _job(tmp_path, 1, leaders)
    (d / "progress").write_text("1.0 10\n2.0 20\n3.0 3")
    sec = _run(state_script(str(tmp_path), [(1, None, None)], {1: 7}))
    assert parse_states(sec["state"][1])[0][1].state == "running"
    assert parse_progress(sec) == ((1, 7, 19, "2.0 20\n3.0 3"),)


def test_a_progress_fifo_or_link_gives_nothing_and_blocks_nothing(tmp_path, leaders):
    os.mkfifo(_job(tmp_path, 1, leaders) / "progress")
    (_job(tmp_path, 2, leaders) / "progress").symlink_to("/etc/passwd")
    sec = _run(state_script(str(tmp_path), [(1, None, None), (2, None, None)], {1: 0, 2: 0}))
    assert [s.state for _, s in parse_states(sec["state"][1])] == ["running", "running"]
    assert parse_progress(sec) == ()


def test_progress_cannot_forge_the_poll(tmp_path, leaders):
    d = _job(tmp_path, 1, leaders)
    forged = "@@iadeep gpu 0\n0, GPU-x, forged\n@@iadeep state\n1 exited 1 0\n\x1b[2J\xff\r\n"
    (d / "progress").write_bytes(forged.encode())
    out = run_bounded(["sh", "-c", state_script(str(tmp_path), [(1, None, None)], {1: 0})],
                      30)[1].decode()
    snap = parse_poll("n", out, expected=[1])
    assert snap.jobs is not None and [s.state for _, s in snap.jobs] == ["running"]
    assert "gpu" not in split_sections(out)                 # nothing passed for a section
    [(job, start, size, text)] = snap.progress
    assert (job, start, size, len(text)) == (1, 0, len(forged.encode()), size)
    assert "@" not in text and "\x1b" not in text and "\r" not in text


def test_each_file_gets_exactly_its_own_bytes_of_the_polls_one_read(tmp_path, leaders):
    """Several jobs' new bytes come back together, cut by dd's own counts: a job that writes a
    marker line, a count line or bytes no progress line holds changes nothing of another
    job's, and a file with nothing new is not read at all."""
    forged = b"1 1\n@@iadeep progress:2 0,3\n0+1 records out\n3 bytes copied, 1 s, 3 B/s\n\xff\x00"
    files = {1: forged, 2: b"2.0 20\n3.0 30\n", 3: b"", 4: b"4.5 45\n4.6"}
    for job, data in files.items():
        (_job(tmp_path, job, leaders) / "progress").write_bytes(data)
    sec = _run(state_script(str(tmp_path), [(j, None, None) for j in files],
                            {1: 0, 2: 7, 3: 0, 4: 0}))
    got = {job: (start, size, text) for job, start, size, text in parse_progress(sec)}
    shown = "".join(chr(b) if chr(b) in "0123456789.eE+ \n-" else "?" for b in forged)
    assert got[1] == (0, len(forged), shown)
    assert got[2] == (7, 14, "3.0 30\n") and got[4] == (0, 10, "4.5 45\n4.6")
    assert 3 not in got


def test_progress_read_as_its_owner_comes_through_the_users_section(tmp_path, leaders):
    """On a ``run_as: submitter`` node the same script runs as each user, its output prefixed
    line by line (``runas.poll_sections``' ``sed``): the bytes still come out exact, and only
    the user's own jobs' are taken."""
    for job, data in {1: b"1.0 10\n2.0 20\n", 2: b"\n\n5.0 50\n"}.items():
        (_job(tmp_path, job, leaders) / "progress").write_bytes(data)
    script = state_script(str(tmp_path), [(1, None, None), (2, None, None)], {1: 7, 2: 0})
    _, out, _ = run_bounded(["sh", "-c", f"{{ {script}\n}} | sed 's/^/| /'"], 30)
    sec = split_sections(f"@@iadeep as:alice\n{out.decode()}\n@@iadeep as-rc:alice 0\n")
    got = user_states(sec, {1: "alice", 2: "bob"})
    assert got.errors == {} and got.progress == ((1, 7, 14, "2.0 20\n"),)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="runs the poll as another account (root and setpriv needed)")
def test_a_file_dd_cannot_open_costs_only_its_own_job_its_progress(leaders):
    """A job can make its own progress file unreadable to the account that polls (``chmod 000``:
    still a regular file of its own, so it is tried, and dd fails to open it, copying nothing):
    only that job's progress is missing, the other jobs' bytes are still believed."""
    base = Path(tempfile.mkdtemp(prefix="iadeep-jr-"))
    try:
        base.chmod(0o755)
        for job, data in {1: b"1.0 10\n", 2: b"2.0 20\n"}.items():
            d = _job(base, job, leaders)
            (d / "progress").write_bytes(data)
        for path in [base / "jobs", *(base / "jobs").rglob("*")]:
            os.chown(path, 65534, 65534)
        (base / "jobs" / "1" / "progress").chmod(0)
        script = state_script(str(base), [(1, None, None), (2, None, None)], {1: 0, 2: 0})
        _, out, _ = run_bounded(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                 "sh", "-c", script], 30)
        sec = split_sections(out.decode())
        assert [s.state for _, s in parse_states(sec["state"][1])] == ["running", "running"]
        assert parse_progress(sec) == ((2, 0, 7, "2.0 20\n"),)
    finally:
        shutil.rmtree(base)


def test_a_job_writing_more_than_a_poll_reads_gives_its_latest_bytes(tmp_path, leaders):
    d = _job(tmp_path, 1, leaders)
    (d / "progress").write_bytes(b"1 1\n" + b"9" * (2 * PROGRESS_MAX))
    sec = _run(state_script(str(tmp_path), [(1, None, None)], {1: 0}))
    [(_, start, size, text)] = parse_progress(sec)
    assert (start, size, text) == (size - PROGRESS_MAX, 4 + 2 * PROGRESS_MAX, "9" * PROGRESS_MAX)


def test_a_progress_file_swapped_with_a_fifo_never_blocks_the_poll(tmp_path, leaders):
    """The job swaps its progress file with a FIFO as fast as it can while the poll reads it
    again and again: every poll ends by itself, and what it believes came from a regular file
    (a FIFO read at the moment of a swap gives nothing, and is not taken for an empty file)."""
    d = _job(tmp_path, 1, leaders)
    swapper = subprocess.Popen([sys.executable, "-c", f"""
import os, time
d = {str(d)!r}
n = 0
while not os.path.exists(d + "/stop"):
    os.mkfifo(d + "/f.tmp"); os.rename(d + "/f.tmp", d + "/progress")
    time.sleep(0.005)
    with open(d + "/r.tmp", "w") as f:
        f.write(f"{{n}}.0 {{n}}\\n")
    os.rename(d + "/r.tmp", d + "/progress"); n += 1
    time.sleep(0.1)
"""], start_new_session=True)
    leaders.append(swapper)
    script = state_script(str(tmp_path), [(1, None, None)], {1: 0})
    seen = 0
    for _ in range(40):
        sec = _run(script)
        assert parse_states(sec["state"][1])[0][1].state == "running"
        for _, start, _, text in parse_progress(sec):
            assert start == 0 and text.endswith("\n") and text.count("\n") == 1
            seen += 1
    (d / "stop").touch()
    swapper.wait(timeout=30)
    assert seen > 0


def test_a_state_part_cut_short_leaves_its_jobs_unknown(tmp_path):
    out = "@@iadeep state\n1 running 5 6\n@@iadeep gpu 0\n"
    snap = parse_poll("n", out, expected=[1, 2])
    assert [(j, s.state) for j, s in snap.jobs or ()] == [(1, "running"), (2, "unknown")]


def test_a_local_command_that_blocks_is_killed_with_its_whole_process_group(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    conn = LocalConnection(Node("here", "localhost", local=True), 1.0)
    with pytest.raises(NodeError, match="did not finish within 1 s"):
        conn.run(f"cat {fifo} & wait")
    # nothing is left blocked opening the FIFO
    assert not any(str(fifo) in _cmdline(p) for p in os.listdir("/proc") if p.isdigit())


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _stat_start(pid: int) -> int:
    """The process's start time as /proc/PID/stat says it (field 22), read by Python."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])


def test_recorded_leaders_are_judged_whatever_they_call_themselves(tmp_path, leaders):
    """The poll reads every recorded leader's /proc/PID/stat in one go (``leaders_script``);
    a name holding ") ", a newline and fake fields moves nothing, a wrong start time (a pid
    reused) or a zombie leader is no running job, and a pid gone falls back to the job's own
    files."""
    odd = tmp_path / "x\n) R 1 1 1"      # a leader named like the fields that follow it
    shutil.copy(shutil.which("sleep") or "/bin/sleep", odd)
    for j in (1, 2, 3, 4, 5):
        _job(tmp_path, j)
    named = subprocess.Popen([str(odd), "600"], start_new_session=True)
    plain = subprocess.Popen(["sleep", "600"], start_new_session=True)
    zombie = subprocess.Popen(["true"], start_new_session=True)   # exits, never reaped
    leaders.extend([named, plain, zombie])
    follower = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"], stdout=subprocess.PIPE,
                                start_new_session=True)   # its child leads no session
    leaders.append(follower)
    child = int(follower.stdout.readline())
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":
        pass
    (tmp_path / "jobs" / "4" / "exit").write_text("3\n")
    expect = [(1, named.pid, _stat_start(named.pid)),
              (2, plain.pid, _stat_start(plain.pid) + 1),   # the pid now leads someone else
              (3, zombie.pid, None),
              (4, 999_999, 5),                               # gone: its exit file says
              (5, child, _stat_start(child))]               # alive, but no session leader
    states = dict(parse_states(_run(state_script(str(tmp_path), expect))["state"][1]))
    assert (states[1].state, states[1].pid, states[1].start) == \
        ("running", named.pid, _stat_start(named.pid))
    assert (states[2].state, states[2].exit_code) == ("exited", None)
    assert (states[3].state, states[3].exit_code) == ("exited", None)
    assert (states[4].state, states[4].exit_code) == ("exited", 3)
    assert states[5].state == "exited"


def test_one_read_gives_each_live_leader_its_state_session_and_start(leaders):
    from iadeep_cli.nodes.shell.jobstate import leaders_script

    a = subprocess.Popen(["sleep", "600"], start_new_session=True)
    leaders.append(a)
    b = subprocess.Popen(["sleep", "600"])                      # not a session leader
    try:
        script = "set -f\n" + leaders_script([a.pid, b.pid, 999_999]) + \
            f'echo "a=$L_{a.pid}"; echo "b=$L_{b.pid}"; echo "gone=${{L_999999:-}}"\n'
        _, out, _ = run_bounded(["sh", "-c", script], 30)
        want = [f"a=S {a.pid} {_stat_start(a.pid)}",
                f"b=S {os.getsid(b.pid)} {_stat_start(b.pid)}", "gone="]
    finally:
        b.kill()
        b.wait()
    assert out.decode().splitlines() == want


# Names a leader can give itself (its comm: 15 bytes) under which its stat line also parses,
# read from an earlier ") ", as a session-1 process: only the last ") " ends the name.  Tabs
# and newlines there would split into extra words for the shell if they ever reached it.
_NAMER = ("import sys, time\n"
          "open('/proc/self/comm', 'w').write(sys.argv[1])\n"
          "print(flush=True); time.sleep(600)\n")


@pytest.mark.parametrize("comm", [") R 1 1 1 ", ") R\t1\t1\t1 ", ")\nR 1 1 1 "])
def test_a_leader_named_like_other_fields_is_judged_by_its_real_ones(tmp_path, leaders, comm):
    for j in (1, 2):
        _job(tmp_path, j)
    named = subprocess.Popen([sys.executable, "-c", _NAMER, comm], start_new_session=True,
                             stdout=subprocess.PIPE)
    plain = subprocess.Popen(["sleep", "600"], start_new_session=True)   # read after it
    leaders.extend([named, plain])
    named.stdout.readline()
    assert Path(f"/proc/{named.pid}/comm").read_text() == comm + "\n"
    expect = [(1, named.pid, _stat_start(named.pid)), (2, plain.pid, _stat_start(plain.pid))]
    states = dict(parse_states(_run(state_script(str(tmp_path), expect))["state"][1]))
    assert (states[1].state, states[1].start) == ("running", _stat_start(named.pid))
    assert (states[2].state, states[2].start) == ("running", _stat_start(plain.pid))


def test_a_thread_id_or_an_odd_pid_file_is_no_leader(tmp_path, leaders):
    """A recorded pid now a thread of another process (its /proc/TID/stat is readable), and pid
    files naming a recorded leader as written, with a leading zero, too long, or at another
    start time."""
    code = ("import threading, time\n"
            "def f():\n    print(threading.get_native_id(), flush=True); time.sleep(600)\n"
            "threading.Thread(target=f).start()\n")
    threads = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                               stdout=subprocess.PIPE)
    plain = subprocess.Popen(["sleep", "600"], start_new_session=True)
    leaders.extend([threads, plain])
    tid = int(threads.stdout.readline())
    t0 = _stat_start(plain.pid)
    for j, text in ((2, f"{plain.pid} {t0}"), (3, f"0{plain.pid} {t0}"), (4, "9" * 60),
                    (5, f"{plain.pid} {t0 + 1}")):
        (_job(tmp_path, j) / "pid").write_text(text + "\n")
    for j in (1, 6):
        _job(tmp_path, j)
    expect = [(1, tid, _stat_start(tid)), (2, None, None), (3, None, None), (4, None, None),
              (5, None, None), (6, plain.pid, t0)]
    states = dict(parse_states(_run(state_script(str(tmp_path), expect))["state"][1]))
    assert {j: s.state for j, s in states.items()} == {
        1: "exited", 2: "running", 3: "exited", 4: "exited", 5: "exited", 6: "running"}


def test_an_exit_file_beyond_a_32_bit_int_is_no_exit_code(tmp_path):
    """A job may overwrite its exit file: a number the database cannot hold (19 digits) is
    no exit code, never a round's failure when the job's end is recorded."""
    for job, said in ((1, "9999999999999999999"), (2, "-2147483649"), (3, "2147483647")):
        d = _job(tmp_path, job)
        (d / "pid").write_text("999999\n")
        (d / "exit").write_text(said + "\n")
    sec = _run(state_script(str(tmp_path), [(j, None, None) for j in (1, 2, 3)]))
    assert sorted((j, s.exit_code) for j, s in parse_states(sec["state"][1])) == \
        [(1, None), (2, None), (3, 2147483647)]

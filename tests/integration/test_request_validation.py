"""Poison and ill-typed requests at the controller's socket, and printing what users typed.

Raw JSON lines go over a real controller's socket for what the CLI would never send; the real
CLI for what a user can type; rows written straight into the database stand for an old
database that already holds control characters."""
import base64
import json
import re
import socket

import pytest

from helpers.controllers import ControllerProcess, cli, jobs_by_id, queue_add

SCRIPT_B64 = base64.b64encode(b"#!/bin/sh\ntrue\n").decode()
# What must never reach a terminal from a name: C0/C1 controls (newline only ends a line).
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    root = tmp_path_factory.mktemp("validation")
    (root / "empty.yaml").write_text("nodes: []\n")
    controller = ControllerProcess(root / "state", root / "empty.yaml").start()
    controller.script = root / "job.sh"
    controller.script.write_text("#!/bin/sh\ntrue\n")
    yield controller
    controller.stop()


def raw(ctl, line: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(ctl.home / "controller.sock"))
        s.settimeout(60)
        s.sendall(line + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, f"no reply to {line[:80]!r}"
            data += chunk
    return json.loads(data)


def add_line(**spec) -> bytes:
    return json.dumps({"op": "add", "args": {"spec": {"script": "/bin/true", **spec},
                                             "script_b64": SCRIPT_B64}}).encode()


ILL_TYPED = [
    (b'{"op": "cancel", "args": {"ids": "12"}}', "ids must be a list"),
    (b'{"op": "cancel", "args": {"ids": 12}}', "ids must be a list"),
    (b'{"op": "hold", "args": {"ids": [1.0]}}', "ids[0] must be an integer, got 1.0"),
    (b'{"op": "hold", "args": {"ids": [true]}}', "ids[0] must be an integer, got a boolean"),
    (b'{"op": "release", "args": {"ids": ["1"]}}', "ids[0] must be an integer, got a string"),
    (b'{"op": "cancel", "args": {"ids": [18446744073709551616]}}', "must be an integer"),
    (b'{"op": "show", "args": {"id": "1"}}', "id must be an integer, got a string"),
    (b'{"op": "show", "args": {"id": null}}', "id must be an integer, got null"),
    (b'{"op": "show", "args": {"id": 1e400}}', "id must be an integer, got inf"),
    (b'{"op": "priority", "args": {"id": 1, "priority": NaN}}', "not valid JSON"),
    (b'{"op": "priority", "args": {"id": 1, "priority": -Infinity}}', "not valid JSON"),
    (b'{"op": "priority", "args": {"id": 1, "priority": 1' + b"0" * 30 + b'}}',
     "integer of 31 digits"),
    (b'{"op": "priority", "args": {"id": 1, "priority": 5000000}}',
     "--priority must be between"),
    (b'{"op": "list", "args": {"all_states": "yes"}}', "all_states must be true or false"),
    (b'{"op": "logs", "args": {"id": 1, "offset": -1}}', "must be 0 or more"),
    (b'{"op": 5}', "expected {"),
    (b'[1, 2]', "expected {"),
    (b'"status"', "expected {"),
    (b'{"op": "status", "args": []}', "args must be an object"),
    (b'{"op": "frobnicate"}', "unknown request"),
    (b'{"op": "status", "user": "root"}', "unknown field 'user'"),
    (b'{"op": "ping", "args": {"user": "root"}}', "cannot name its user"),
    (b'{"op": "status", "args": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
     "not valid JSON"),
    (b'{"op": "status", "args": {"\xff": 1}}', "not valid JSON"),
    (json.dumps({"op": "add", "args": {"spec": "x", "script_b64": SCRIPT_B64}}).encode(),
     "spec must be an object"),
    (json.dumps({"op": "add", "args": {"spec": {}, "script_b64": SCRIPT_B64}}).encode(),
     "spec.script is missing"),
    (add_line(gpus="2"), "spec.gpus must be an integer, got a string"),
    (add_line(gpus=True), "spec.gpus must be an integer, got a boolean"),
    (add_line(gpus=1.5), "spec.gpus must be an integer, got 1.5"),
    (add_line(args="abc"), "spec.args must be a list"),
    (add_line(args=[1]), "spec.args[0] must be a string"),
    (add_line(env={"A": "b"}), "spec.env must be a list"),
    (add_line(env=[["A"]]), "spec.env[0] must be a list of 2 items"),
    (add_line(exclusive="yes"), "spec.exclusive must be true or false"),
    (add_line(user="root"), "unknown field 'user'"),
    (add_line(mem_gib="12"), "spec.mem_gib must be a finite number"),
    (add_line(args=["a"] * 10_001), "spec.args must be a list of at most 10000 items"),
    (add_line().replace(b'"script": "/bin/true"', b'"script": "/bin/true", "mem_gib": 1e999'),
     "spec.mem_gib must be a finite number, got inf"),
    (json.dumps({"op": "add", "args": {"spec": {"script": "/bin/true"},
                                       "script_b64": 5}}).encode(),
     "script_b64 must be a string"),
    (json.dumps({"op": "add", "args": {"spec": {"script": "/bin/true"}, "token": 7,
                                       "script_b64": SCRIPT_B64}}).encode(),
     "token must be a string"),
]

POISON = [
    ({"name": "\x1b[31mred"}, "--name contains the control character '\\x1b' at position 0"),
    ({"name": "a\x00b"}, "--name contains the control character '\\x00'"),
    ({"name": "two\nlines"}, "--name contains the control character '\\n'"),
    ({"name": "x" * 201}, "--name is 201 characters long"),
    ({"args": ["fine", "a\x00b"]}, "argument 2 contains the control character '\\x00'"),
    ({"args": ["\x1b]0;owned\x07"]}, "argument 1 contains the control character '\\x1b'"),
    ({"args": ["'" * 20_000]}, "KiB on the node's command line"),
    ({"env": [["A", "x\x00"]]}, "--env A contains the control character '\\x00'"),
    ({"env": [["A\n", "x"]]}, "bad --env name 'A\\n'"),
    ({"env": [["LD_PRELOAD", "/home/m/x.so"]]}, "--env LD_PRELOAD: iadeep does not pass"),
    ({"exported": [["BASH_ENV", "/home/m/rc"]]}, "--export BASH_ENV: iadeep does not pass"),
    ({"workdir": "/tmp/\x07"}, "--workdir contains the control character '\\x07'"),
    ({"workload": "\u202eevil"}, "--workload contains the control character '\\u202e'"),
    ({"script": "/tmp/x\x1b.sh"}, "the script's path contains the control character"),
    ({"gpus": 65}, "--gpus must be between 1 and 64"),
    ({"mem_gib": 1e6}, "--gpu-mem must be a positive number of GiB up to 4096"),
    ({"min_speed": 0}, "--min-speed must be in (0, 1]"),
    ({"retries": 10**6}, "--retries must be between 0 and 100"),
    ({"priority": 2**40}, "--priority must be between"),
    ({"name": "a\ud800b"}, "spec.name holds '\\ud800', half of a UTF-16 pair"),
    ({"script": "/tmp/x\udcff.sh"}, "spec.script holds '\\udcff', half of a UTF-16 pair"),
    ({"env": [["A", "\udc80"]]}, "spec.env[0][1] holds '\\udc80'"),
    ({"script": "/x/.."}, "script path '/x/..' does not name a file"),
    ({"script": "/"}, "script path '/' does not name a file"),
    ({"script": "/tmp/."}, "script path '/tmp/.' does not name a file"),
]


def _refused(reply: dict, expected: str) -> None:
    assert reply["ok"] is False, reply
    error = reply["error"]
    assert error["type"] == "InputError", error
    assert expected in error["message"], error
    assert "\n" not in error["message"] and "controller failed" not in error["message"]


@pytest.mark.parametrize("line,expected", ILL_TYPED, ids=range(len(ILL_TYPED)))
def test_an_ill_typed_request_is_the_callers_error_in_one_line(ctl, line, expected):
    _refused(raw(ctl, line), expected)


@pytest.mark.parametrize("spec,expected", POISON, ids=range(len(POISON)))
def test_poison_values_are_refused_at_the_socket(ctl, spec, expected):
    _refused(raw(ctl, add_line(**spec)), expected)


def test_refused_submissions_leave_no_file_behind(ctl):
    for spec, _ in POISON[-6:]:
        raw(ctl, add_line(**spec))
    left = [p.name for p in (ctl.home / "scripts").rglob("*") if p.name.endswith(".tmp")]
    assert left == []


def test_ids_sent_as_a_string_act_on_no_job(ctl):
    ids = [queue_add(ctl.home, str(ctl.script)) for _ in range(2)]
    for op in ("cancel", "hold"):
        reply = raw(ctl, json.dumps({"op": op, "args": {"ids": "".join(map(str, ids))}}).encode())
        _refused(reply, "ids must be a list")
    jobs = jobs_by_id(ctl.home)
    assert [jobs[i]["state"] for i in ids] == ["queued", "queued"]


def test_tabs_and_newlines_in_arguments_and_values_are_accepted(ctl):
    reply = raw(ctl, add_line(args=["two\nlines", "a\tb"], env=[["V", "x\ny"]]))
    assert reply["ok"] is True, reply


def test_the_controller_logged_no_failure(ctl):
    for line, _ in ILL_TYPED[:5]:
        raw(ctl, line)
    assert "request failed" not in ctl.log.read_text()


@pytest.mark.parametrize("args,expected", [
    (["--name", "\x1b[31mred"], "--name contains the control character '\\x1b'"),
    (["bad\x07arg"], "argument 1 contains the control character '\\x07'"),
    (["--env", "A=\x1b[2J"], "--env A contains the control character '\\x1b'"),
    (["--workdir", "/tmp/\x1b"], "--workdir contains the control character '\\x1b'"),
])
def test_the_cli_refuses_control_characters_in_one_line(ctl, args, expected):
    out = cli(ctl.home, "queue", "add", str(ctl.script), *args)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"Error: {expected}") and out.stderr.count("\n") == 1
    assert not RAW_CONTROL.search(out.stderr)


def test_the_cli_prints_old_poisoned_rows_visibly_escaped(ctl, monkeypatch):
    """A database written before these checks may hold anything: every view escapes it."""
    from iadeep_cli.jobs import JobSpec, JobState
    from iadeep_cli.snapshot import GpuSample, NodeSnapshot
    from iadeep_cli.store import Store, cluster, jobrows

    evil = "\x1b[2J\x1b]0;owned\x07\u202e"
    spec = JobSpec("/tmp/x" + evil, args=("a" + evil,), name="n" + evil, workdir="/w" + evil,
                   env=(("V", evil),), workload="w" + evil)
    store = Store(ctl.home / "iadeep.db")
    try:
        with store.tx() as conn:
            job_id, _ = jobrows.insert(conn, "mallory", spec, 1.0)
            jobrows.transition(conn, job_id, JobState.STARTING, "r" + evil, "mallory", 2.0,
                               node="node" + evil, gpu_indices=[0])
            cluster.save_nodes(conn, (NodeSnapshot("node" + evil, 3.0, (GpuSample(
                0, "GPU-0", "H200" + evil, memory_total_mib=1.0),)),))
    finally:
        store.close()
    outputs = {" ".join(argv): cli(ctl.home, *argv, check=True).stdout for argv in (
        ["queue", "list"], ["queue", "list", "--all"], ["queue", "show", str(job_id)],
        ["queue", "why", str(job_id)], ["status"])}
    for command, out in outputs.items():
        assert not RAW_CONTROL.search(out), command
        assert "\\x1b[2J\\x1b]0;owned\\x07\\u202e" in out, command
    shown = json.loads(cli(ctl.home, "queue", "show", str(job_id), "--json").stdout)
    assert shown["name"] == "n" + evil   # --json keeps the data exact (JSON escapes it)
    # The monitor gets its data from one place, escaped the same way.
    from iadeep_cli.messages import encode
    from iadeep_cli.tui import source
    monkeypatch.setenv("IADEEP_HOME", str(ctl.home))
    data = source.fetch()
    for view in (data.status, data.jobs, source.show(job_id)[0]):
        text = json.dumps(encode(view), ensure_ascii=False)
        assert not RAW_CONTROL.search(text) and "\\x1b[2J" in text

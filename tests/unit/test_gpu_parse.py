"""The poll parser against real H200 nvidia-smi output and hand-made variants of it."""
from __future__ import annotations

import json

import pytest

from iadeep_cli.nodes.gpu import (
    APP_FIELDS,
    GPU_FIELDS,
    MARK,
    MAX_APPS,
    MAX_GPUS,
    MAX_TEXT,
    job_map,
    remote_path,
)
from iadeep_cli.nodes.shell.jobstate import parse_poll, poll_script
from iadeep_cli.snapshot import RemoteJob

GPU_IDLE = "h200-idle-query-gpu-full.csv-noheader-nounits.txt"
GPU_LOADED = "h200-loaded-query-gpu-full.csv-noheader-nounits.txt"
APPS_LOADED = "h200-loaded-compute-apps-full.csv-noheader-nounits.txt"
APPS_IDLE = "h200-idle-compute-apps-full.csv-noheader-nounits.txt"


def output(gpu: str, apps: str = "", gpu_rc: int = 0, procs: str = "", state: str = "",
           dirs: str = "") -> str:
    """What the poll script prints, assembled from its parts."""
    return (f"{MARK} state\n{state}\n{MARK} dirs\n{dirs}\n"
            f"{MARK} gpu {gpu_rc}\n{gpu}\n{MARK} apps 0\n{apps}\n{MARK} procs\n{procs}\n")


def cols(line: str, fields) -> dict:
    return dict(zip(fields, [c.strip() for c in line.split(",")]))


def test_fixture_commands_are_the_ones_iadeep_runs(smi_fixture):
    script = poll_script("~/.iadeep")
    rows = [r.split("\t") for r in smi_fixture("COMMANDS.tsv").splitlines()[1:]]
    used = {cmd for f, cmd, rc in rows if f in (GPU_IDLE, APPS_LOADED)}
    assert len(used) == 2 and all(cmd in script for cmd in used)


def test_idle_h200(smi_fixture):
    raw = smi_fixture(GPU_IDLE)
    snap = parse_poll("n1", output(raw, smi_fixture(APPS_IDLE)))
    want = cols(raw.strip(), GPU_FIELDS)
    assert snap.ok and len(snap.gpus) == 1
    g = snap.gpus[0]
    assert (g.index, g.uuid, g.name) == (int(want["index"]), want["uuid"], want["name"])
    assert g.memory_total_mib == float(want["memory.total"])
    assert g.memory_free_mib == float(want["memory.free"])
    assert g.power_draw_w == float(want["power.draw"])
    assert g.temperature_c == float(want["temperature.gpu"])
    assert snap.driver_version == want["driver_version"]
    assert g.processes == ()


def test_loaded_h200_processes_are_foreign(smi_fixture):
    apps = smi_fixture(APPS_LOADED)
    snap = parse_poll("n1", output(smi_fixture(GPU_LOADED), apps))
    rows = [cols(line, APP_FIELDS) for line in apps.splitlines() if line.strip()]
    procs = snap.gpus[0].processes
    assert sorted(p.pid for p in procs) == sorted(int(r["pid"]) for r in rows)
    assert sum(p.used_memory_mib for p in procs) == sum(float(r["used_memory"]) for r in rows)
    assert all(p.foreign for p in procs)
    assert snap.gpus[0].utilization_gpu == float(cols(smi_fixture(GPU_LOADED), GPU_FIELDS)
                                                 ["utilization.gpu"])


def test_not_available_fields_become_none(smi_fixture):
    parts = smi_fixture(GPU_LOADED).strip().split(", ")
    for i in (8, 9):
        parts[i] = "[Not Supported]"
    for i in (10, 11, 12):
        parts[i] = "[N/A]"
    apps = smi_fixture(APPS_LOADED).replace(", 1838,", ", [N/A],")
    g = parse_poll("n1", output(", ".join(parts), apps)).gpus[0]
    assert (g.utilization_gpu, g.utilization_memory, g.temperature_c, g.power_draw_w,
            g.power_limit_w) == (None,) * 5
    assert g.memory_used_mib == float(parts[6])
    assert sum(p.used_memory_mib is None for p in g.processes) == apps.count("[N/A]") > 0


@pytest.mark.parametrize("rc,body,needle", [
    (127, "sh: 1: nvidia-smi: not found", "not found"),
    (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
        "sure that the latest NVIDIA driver is installed and running.", "couldn't communicate"),
])
def test_failures_are_node_errors(rc, body, needle):
    snap = parse_poll("n1", output(body, gpu_rc=rc))
    assert not snap.ok and needle in snap.error and f"exit {rc}" in snap.error


def test_no_gpu_is_ok_and_empty():
    snap = parse_poll("n1", output("No devices were found", gpu_rc=6))
    assert snap.ok and snap.gpus == ()


def test_garbage_is_an_error_not_a_crash():
    assert "unexpected poll output" in parse_poll("n1", "bash: fish\n").error
    assert "cannot parse" in parse_poll("n1", output("0, only, three")).error


def test_job_processes_tagged_by_env_or_session(smi_fixture):
    apps = smi_fixture(APPS_LOADED)
    # 450: env says job 5 (live); 451: same session as job 6's leader; 452: env names a job
    # with no directory here -> foreign; 454: env names job 7, which just exited (its last
    # process is still going) -> still job 7; 455: session of job 8's leader, but job 8 has
    # exited, so that pid (and session) may be reused by a stranger -> foreign.
    procs = "450 100 5\n451 200\n452 300 99\n454 400 7\n455 500\n"
    state = "5 running 100 11\n6 running 200 12\n7 exited 400 0\n8 exited 500 1\n"
    snap = parse_poll("n1", output(smi_fixture(GPU_LOADED), apps, procs=procs, state=state,
                                   dirs="5\n6\n7\n8\n"))
    tags = {p.pid: p.job_id for p in snap.gpus[0].processes}
    assert (tags[450], tags[451], tags[452], tags[453]) == (5, 6, None, None)
    assert (tags[454], tags[455]) == (7, None)
    assert snap.jobs == ((5, RemoteJob("running", None, 100, 11)),
                         (6, RemoteJob("running", None, 200, 12)),
                         (7, RemoteJob("exited", 0, 400)), (8, RemoteJob("exited", 1, 500)))
    assert job_map("x y\n", set(), {}) == {}
    # a launch in progress (a claimed directory, no pid yet) already counts for its
    # env-tagged processes, but gives no session to match strangers against
    snap = parse_poll("n1", output(smi_fixture(GPU_LOADED), apps, procs="450 600 9\n451 9\n",
                                   state="9 claimed\n", dirs="9\n"))
    tags = {p.pid: p.job_id for p in snap.gpus[0].processes}
    assert (tags[450], tags[451]) == (9, None) and snap.jobs == ((9, RemoteJob("claimed")),)


def test_inventory_gpu_subset(smi_fixture):
    two = smi_fixture(GPU_IDLE) + smi_fixture(GPU_IDLE).replace("0, GPU-bd43", "1, GPU-ff43")
    assert [g.index for g in parse_poll("n", output(two)).gpus] == [0, 1]
    assert [g.index for g in parse_poll("n", output(two), only=(1,)).gpus] == [1]


def test_remote_path_quotes_but_keeps_home():
    assert remote_path("~/.iadeep") == '"$HOME"/.iadeep'
    assert remote_path("/a b/$(x)") == "'/a b/$(x)'"


# ----------------------------------------------------------------- untrusted values (issue 9.10)
def strict_json(text: str):
    """json.loads that refuses NaN/Infinity, as strict parsers (jq, JavaScript) do."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("field, raw", [
    ("memory.used", "NaN"), ("memory.free", "-5"), ("utilization.gpu", "inf"),
    ("utilization.memory", "101"), ("temperature.gpu", "1e400"), ("power.draw", "-Infinity"),
    ("power.limit", "9e99"), ("memory.total", "1e12"),
])
def test_non_finite_negative_or_absurd_values_are_not_available(smi_fixture, field, raw):
    parts = smi_fixture(GPU_LOADED).strip().split(", ")
    parts[GPU_FIELDS.index(field)] = raw
    g = parse_poll("n1", output(", ".join(parts))).gpus[0]
    attr = {"memory.used": "memory_used_mib", "memory.free": "memory_free_mib",
            "utilization.gpu": "utilization_gpu", "utilization.memory": "utilization_memory",
            "temperature.gpu": "temperature_c", "power.draw": "power_draw_w",
            "power.limit": "power_limit_w", "memory.total": "memory_total_mib"}[field]
    assert getattr(g, attr) is None
    assert g.name == "NVIDIA H200" and g.memory_used_mib in (None, 64172.0)


def test_strings_are_cut_and_made_safe_for_terminals(smi_fixture):
    parts = smi_fixture(GPU_LOADED).strip().split(", ")
    parts[GPU_FIELDS.index("name")] = "NVIDIA H200\x1b[2J" + "X" * 5000
    apps = smi_fixture(APPS_LOADED).replace("/opt/torch/.venv/bin/python3",
                                            "/bin/\x1b]0;owned\x07" + "y" * 10_000, 1)
    snap = parse_poll("n1", output(", ".join(parts), apps))
    g = snap.gpus[0]
    assert g.name.startswith("NVIDIA H200?[2J") and len(g.name) == MAX_TEXT
    names = [p.name for p in g.processes]
    assert max(map(len, names)) == MAX_TEXT
    assert not any(c in name for name in [g.name, *names] for c in "\x1b\x07")


def test_rows_that_are_not_processes_are_skipped(smi_fixture):
    lines = smi_fixture(APPS_LOADED).splitlines()
    pids = ["nan", "-7", "1e30", "0", "45.5"]
    for i, pid in enumerate(pids):
        lines[i] = pid + lines[i][3:]     # the fixture's pids have three digits
    row = lines[6].split(", ")
    lines[6] = ", ".join([*row[:3], "NaN", *row[4:]])
    procs = parse_poll("n1", output(smi_fixture(GPU_LOADED), "\n".join(lines))).gpus[0].processes
    assert len(procs) == len(lines) - len(pids)
    assert sum(p.used_memory_mib is None for p in procs) == 1
    assert all(isinstance(p.pid, int) and p.pid > 0 for p in procs)


@pytest.mark.parametrize("index", ["-1", "1.5", "nan", "4096"])
def test_a_gpu_without_a_valid_index_is_an_error(smi_fixture, index):
    row = smi_fixture(GPU_IDLE).strip().split(", ")
    row[0] = index
    assert "valid index" in parse_poll("n1", output(", ".join(row))).error


def test_row_counts_are_bounded(smi_fixture):
    row = smi_fixture(GPU_IDLE).strip()
    many = "\n".join(row.replace("0, GPU-", f"{i}, GPU-", 1) for i in range(MAX_GPUS + 1))
    assert f"more than {MAX_GPUS} rows" in parse_poll("n1", output(many)).error
    app = smi_fixture(APPS_LOADED).splitlines()[0]
    flood = "\n".join([app] * (MAX_APPS + 1))
    assert f"more than {MAX_APPS} rows" in parse_poll("n1", output(row, flood)).error


def test_json_output_is_standard(capsys):
    from iadeep_cli.cli.render import as_json
    from iadeep_cli.snapshot import GpuSample, NodeSnapshot, to_dict

    # As a database written before values were validated could hold them:
    snap = NodeSnapshot("n1", 1.0, gpus=(GpuSample(0, "u", "g", utilization_gpu=float("nan"),
                                                   power_draw_w=float("inf")),))
    as_json({"nodes": [to_dict(snap)], "speeds": (float("-inf"), 0.5)})
    data = strict_json(capsys.readouterr().out)
    assert data["nodes"][0]["gpus"][0]["utilization_gpu"] is None
    assert data["nodes"][0]["gpus"][0]["power_draw_w"] is None
    assert data["speeds"] == [None, 0.5]


def _as(user: str, rc: int, inner: str) -> str:
    """One user's section of a submitter node's poll (see runas.poll_sections)."""
    body = "".join(f"| {line}\n" for line in inner.splitlines())
    return f"{MARK} as:{user}\n{body}\n{MARK} as-rc:{user} {rc}\n"


def test_submitter_sections_are_believed_only_about_their_own_users_jobs(smi_fixture):
    """alice's section reports her job 5 and tags her process 450; what it says about bob's
    job 6, or a tag on bob's process, is ignored; bob's section could not run (sudo refused),
    so his job is unknown: never missing (which would start it again)."""
    alice = (f"{MARK} state\n5 running 100 11\n6 exited 200 0\n{MARK} dirs\n5\n"
             f"{MARK} tags\n450 5\n451 5\n@@iadeep as:bob\n")
    users = _as("alice", 0, alice) + _as("bob", 91, "iadeep-runas: sudo -n -u bob refused")
    procs = "450 450 - alice\n451 451 - bob\n"
    out = output(smi_fixture(GPU_LOADED), smi_fixture(APPS_LOADED), procs=procs)
    out = out.replace(f"{MARK} gpu", users + f"{MARK} gpu", 1)
    snap = parse_poll("n1", out, owners={5: "alice", 6: "bob"})
    assert dict(snap.jobs) == {5: RemoteJob("running", None, 100, 11), 6: RemoteJob("unknown")}
    tags = {p.pid: p.job_id for p in snap.gpus[0].processes}
    assert (tags[450], tags[451]) == (5, None)
    # a job whose owner has no section at all (the poll stopped early) is unknown too
    snap = parse_poll("n1", output(smi_fixture(GPU_LOADED)), owners={7: "carol"})
    assert snap.jobs == ((7, RemoteJob("unknown")),)


def test_a_stored_snapshot_is_asdicts_without_the_rounds_own_fields(smi_fixture):
    """``to_dict`` (what the store keeps every round) is ``dataclasses.asdict`` of a polled
    node, GPUs, processes and jobs included, less ``progress``, ``progress_asked`` and
    ``closed``; and it reads back as the same node."""
    import dataclasses

    from iadeep_cli.snapshot import node_from_dict, to_dict

    state = "5 running 100 11\n7 exited 400 0\n"
    snap = parse_poll("n1", output(smi_fixture(GPU_LOADED), smi_fixture(APPS_LOADED),
                                   procs="450 100 5\n", state=state, dirs="5\n7\n"))
    snap = dataclasses.replace(snap, progress=((5, 0, 3, "1 2"),), progress_asked=(5,),
                               closed="launches fail")
    assert snap.gpus and snap.gpus[0].processes and snap.jobs   # a full node, not a thin one
    want = dataclasses.asdict(snap)
    del want["progress"], want["progress_asked"], want["closed"]
    assert to_dict(snap) == want
    assert json.loads(json.dumps(to_dict(snap))) == json.loads(json.dumps(want))
    assert node_from_dict(json.loads(json.dumps(to_dict(snap)))) == \
        dataclasses.replace(snap, progress=(), progress_asked=(), closed=None)

"""The typed protocol (iadeep_cli/messages.py) and the one operations table.

Views are computed from real seeded state databases by the same code the controller runs;
the JSON they make is pinned key by key, because `--json` users and the docs depend on it.
"""
from __future__ import annotations

import json

import pytest

from helpers import seed
from iadeep_cli import messages as m
from iadeep_cli.controller.requests import offline, views
from iadeep_cli.controller.requests.service import OPERATIONS, Service
from iadeep_cli.errors import ControllerUnavailable, InputError, NotFoundError, PermissionDenied
from iadeep_cli.jobs import FINISHED, JobSpec, JobState, SubmitSpec
from iadeep_cli.settings import Inventory, Node, NotifySettings
from iadeep_cli.snapshot import GpuSample
from iadeep_cli.store import Store, jobrows

JOB_KEYS = ["id", "name", "user", "state", "gpus", "node", "gpu_indices", "submitted_at",
            "started_at", "ended_at", "exit_code", "script", "args", "workdir", "env",
            "mem_gib", "workload", "priority", "exclusive", "retries", "min_speed", "time_limit_s",
            "signal", "notify", "attempts",
            "remote_pid", "reason", "predicted_speed", "observed_speed",
            "submit_dir", "output", "error", "constraint", "nodelist", "exclude", "exported"]
STATUS_KEYS = ["now", "nodes", "queue", "controller", "stale_after_s",
               "impact_last_hour", "impact_since_start"]   # issue 14's two, at the end
IMPACT_KEYS = ["since", "until", "busy_gpu_hours", "work_gpu_hours", "saved_gpu_hours",
               "impact_factor", "measured_share", "energy_kwh"]
NODE_KEYS = ["name", "taken_at", "gpus", "error", "driver_version", "rtt_s", "jobs", "age_s",
             "down_since", "state", "drain"]   # `nodes drain`'s, at the end
GPU_JOB_KEYS = ["id", "name", "user", "state", "predicted_speed", "observed_speed"]
CONTROLLER_KEYS = ["pid", "started_at", "heartbeat_at", "poll_interval_s", "aging_per_hour",
                   "nodes", "degraded"]


def _requests() -> list[type[m.Request]]:
    found, todo = [], [m.Request]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if "op" in vars(sub):
                found.append(sub)
    return found


def test_every_request_type_has_exactly_one_operation():
    ops = [r.op for r in _requests()]
    assert sorted(ops) == sorted(set(ops)) == sorted(OPERATIONS)
    assert all(OPERATIONS[r.op].request is r for r in _requests())
    assert {op for op, o in OPERATIONS.items() if o.offline} == {"list", "show", "status",
                                                                  "profiles"}


@pytest.fixture
def seeded(home):
    seed.seed_state_dir("down")
    store = Store()
    yield store
    store.close()


def _wire(value) -> str:
    return json.dumps(m.encode(value))


def test_views_keep_the_json_keys_they_always_had(seeded):
    reader = views.StoreReader(seeded)
    jobs = reader.jobs(all_states=True, owner=None)
    assert jobs and all(list(j.to_dict()) == JOB_KEYS for j in jobs)
    for job in jobs:   # an unfinished job's run-time estimate is a key added after them
        keys = list(m.encode(reader.job(job.id)))
        assert keys[:len(JOB_KEYS) + 1] == [*JOB_KEYS, "events"]
        assert keys[len(JOB_KEYS) + 1:] == (["effective_priority"] if "effective_priority"
                                            in keys else []) + (
            ["runtime_estimate"] if job.state not in FINISHED else [])
    status = m.encode(reader.status())
    assert list(status) == STATUS_KEYS
    assert list(status["impact_last_hour"]) == list(status["impact_since_start"]) == IMPACT_KEYS
    assert list(status["controller"])[:5] == CONTROLLER_KEYS[:5]
    node = next(n for n in status["nodes"] if n["name"] == "gpu-a")
    assert list(node) == NODE_KEYS
    gpu = node["gpus"][0]
    assert list(gpu) == [*GpuSample.__dataclass_fields__, "jobs"]
    assert gpu["jobs"] and all(list(j) == GPU_JOB_KEYS for j in gpu["jobs"])
    assert set(status["queue"]) == {s.value for s in JobState}


def test_views_cross_the_wire_unchanged(seeded):
    """What the controller sends decodes to the very view it encoded, and back to the same
    JSON: the CLI's `--json` prints what the controller computed."""
    reader = views.StoreReader(seeded)
    jobs = reader.jobs(all_states=True, owner=None)
    for hint, value in ((list[m.JobView], jobs), (m.StatusView, reader.status()),
                        (m.JobDetail, reader.job(jobs[-1].id)),
                        (list[m.ProfileView], reader.profiles())):
        back = m.decode(hint, json.loads(_wire(value)))
        assert back == value
        assert _wire(back) == _wire(value)


def test_the_controller_record_is_written_and_read_as_one_type():
    record = m.ControllerView(pid=1, started_at=1.0, heartbeat_at=2.0, poll_interval_s=3.0,
                              aging_per_hour=1.0, nodes=("n1",),
                              degraded=InputError("disk full", hint="free some"))
    assert list(record.to_dict()) == CONTROLLER_KEYS      # stopped_at only once it stopped
    back = m.ControllerView.from_dict(json.loads(json.dumps(record.to_dict())))
    assert back.degraded.message == "disk full" and type(back.degraded) is InputError
    assert m.ControllerView().to_dict() == {}             # no controller ever ran


def test_a_jobs_owner_travels_as_user_and_nowhere_else_by_that_name():
    assert m.JobView.key("owner") == m.GpuJob.key("owner") == "user"
    request = m.ListRequest(owner="bob")
    assert request.to_dict() == {"all_states": False, "owner": "bob", "limit": None,
                                 "before": None}
    assert m.ListRequest.from_dict(request.to_dict()) == request


@pytest.mark.parametrize("request_type, args, message", [
    (m.ShowRequest, {}, "malformed 'show' request: missing a required argument: 'id'"),
    (m.StatusRequest, {"x": 1},
     "malformed 'status' request: got an unexpected keyword argument 'x'"),
    (m.PingRequest, {"user": "root"}, "malformed request: a request cannot name its user"),
    (m.HoldRequest, {"ids": "12"}, "ids must be a list"),
    (m.LogsRequest, {"id": 1, "offset": True}, "offset must be an integer, got a boolean"),
    (m.ListRequest, {"owner": 5}, "owner must be a string"),
])
def test_requests_are_checked_against_their_fields(request_type, args, message):
    with pytest.raises(InputError) as err:
        request_type.from_dict(args)
    assert message in err.value.message


def test_requests_cross_the_wire_unchanged():
    for request in (m.AddRequest(SubmitSpec.from_dict({"script": "/j.sh"}), "t", "IyEK"),
                    m.AddRequest(SubmitSpec.of(JobSpec("/j.sh", args=("a",), gpus=2),
                                               retries=0), "t"),
                    m.CancelRequest((1, 2)),
                    m.PriorityRequest(3, -5), m.FenceRequest("n1"), m.ListRequest(True, "a"),
                    m.LogsRequest(4, 10, 20), m.ProfileUnpinRequest("mlp")):
        wire = json.loads(json.dumps({"op": request.op, "args": request.to_dict()}))
        assert OPERATIONS[wire["op"]].request.from_dict(wire["args"]) == request


def test_an_old_clients_spec_still_works_and_a_newer_clients_unknown_option_is_refused(seeded):
    """The protocol's rule applied to the submission (``jobs.SubmitSpec``): a key left out
    takes its default, the lab's for retries and notify; a key the controller does not know
    is refused with an error naming it, never dropped."""
    lab = Inventory(nodes=(Node("gpu-a", "gpu-a"),), default_retries=2,
                    notify=NotifySettings(default="end", webhook="http://127.0.0.1:9/hook"))
    service = Service(seeded, lab)
    # what an early client sent: the fields it knew, none added since (--array, --chdir's
    # submission directory, --opportunistic, ...), retries and notify left to the lab
    old = {"script": "/bin/true", "args": ["a"], "name": "old", "gpus": 1, "mem_gib": None,
           "workload": None, "priority": 0, "exclusive": False, "workdir": None, "env": []}

    def add(spec: dict, token: str) -> m.JobView:
        added = service.handle("add", {"spec": spec, "token": token, "script_b64": "IyEK"},
                               "alice")
        return views.StoreReader(seeded).job(added["id"]).job

    job = add(old, "t1")
    assert (job.name, job.args, job.retries, job.notify) == ("old", ("a",), 2, "end")
    assert (job.array, job.submit_dir, job.opportunistic) == (None, None, None)
    given = add({**old, "retries": 0, "notify": "none"}, "t2")   # JobSpec's defaults, but given
    assert (given.retries, given.notify) == (0, "none")
    # a newer client's option this controller does not know
    with pytest.raises(InputError) as err:
        add({**old, "gpu_kind": "h200"}, "t3")
    assert err.value.message == "malformed request: spec has an unknown field 'gpu_kind'"
    assert "upgrade the controller, or leave the option out" in (err.value.hint or "")
    # ... while a newer client's spec sends only what differs from JobSpec's defaults, so
    # an older controller takes it as long as it uses no option that controller lacks
    spec = SubmitSpec.of(JobSpec("/bin/true", name="x", priority=0), notify="fail")
    assert spec.to_dict() == {"script": "/bin/true", "name": "x", "notify": "fail"}
    assert SubmitSpec.from_dict(spec.to_dict()) == spec
    assert spec.resolve(retries=2, notify="end") == JobSpec("/bin/true", name="x", retries=2,
                                                            notify="fail")


def test_service_dispatches_by_the_table_and_refuses_non_admins_there(seeded):
    service = Service(seeded, Inventory(nodes=(Node("gpu-a", "gpu-a"),), admins=("pi",)))
    listed = service.handle("list", {"owner": "bob"}, "alice")
    assert listed and {j["user"] for j in listed} == {"bob"}
    with seeded.tx() as conn:   # alice is not bob, nor an admin: env values hidden
        expected = views.select_jobs(conn, owner="bob", reveal=lambda owner: False)
    assert listed == json.loads(_wire(expected))
    with pytest.raises(PermissionDenied, match="only a lab admin may fence a node; bob is"):
        service.handle("fence", {"node": "no-such-node"}, "bob")   # refused before looked up
    with pytest.raises(InputError, match="no node named 'no-such-node'"):
        service.handle("fence", {"node": "no-such-node"}, "pi")
    assert service.handle("ping", {}, "pi") == {"user": "pi", "admin": True}


def test_offline_readers_answer_like_the_database(seeded):
    """The public snapshot answers the read-only operations as the database does, less the
    env values and the events it never holds."""
    reader = views.StoreReader(seeded)
    with seeded.tx() as conn:
        public = json.loads(json.dumps(offline.public_views(conn, seed.NOW)))
    snapshot = offline.SnapshotReader(public)
    for all_states in (False, True):
        from_db = reader.jobs(all_states, None)
        assert [j.id for j in snapshot.jobs(all_states, None)] == [j.id for j in from_db]
    assert [j.owner for j in snapshot.jobs(True, "bob")] == ["bob"] * len(
        reader.jobs(True, "bob"))
    job = reader.jobs(False, None)[0]
    assert snapshot.job(job.id).job.name == job.name and snapshot.job(job.id).events == ()
    assert snapshot.profiles() == reader.profiles()
    assert [n.name for n in snapshot.status().nodes] == [n.name for n in reader.status().nodes]
    finished = [j for j in reader.jobs(True, None) if j.state in FINISHED]
    assert all(snapshot.job(j.id) for j in finished)


def test_offline_reads_go_through_the_same_table(home):
    down = ControllerUnavailable("the controller is not running")
    with pytest.raises(ControllerUnavailable):
        offline.read(m.PingRequest(), down)               # not an offline operation
    status, since = offline.read(m.StatusRequest(), down)   # no controller ever ran here
    assert since == 0.0 and set(m.encode(status)) == {"now", "nodes", "queue", "controller"}
    assert m.encode(status)["controller"] == {} and offline.read(m.ListRequest(), down)[0] == []
    with pytest.raises(NotFoundError, match="no job with id 7"):
        offline.read(m.ShowRequest(7), down)


def test_escaping_reaches_every_string_of_a_typed_view(seeded):
    from iadeep_cli.checks import escaped

    with seeded.tx() as conn:
        job_id = jobrows.select(conn)[0].id
        conn.execute("UPDATE jobs SET name=?, reason=? WHERE id=?",
                     ("evil\x1b[31m", "why\x07", job_id))
        conn.execute("UPDATE events SET reason=? WHERE job_id=?", ("ev\x1b", job_id))
    detail = escaped(views.StoreReader(seeded).job(job_id))
    assert (detail.job.name, detail.job.reason) == ("evil\\x1b[31m", "why\\x07")
    assert {e.reason for e in detail.events} == {"ev\\x1b"}
    assert detail.job.state is not None and isinstance(detail.job.state, JobState)

"""Identity comes from the OS (SO_PEERCRED): real second accounts, real uid switches."""
import json
import os
import pwd
import shutil
import stat
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

import iadeep_cli.cli.main
from helpers.accounts import ensure_user, needs_root, run_as, shared_dir
from helpers.controllers import ControllerProcess
from iadeep_cli.controller import client  # loaded here: the accounts cannot read /root
from iadeep_cli.errors import IadeepError

USERS = ("iadeep-alice", "iadeep-bob", "iadeep-admin")

pytestmark = needs_root   # creates Unix accounts


_ensure_user = ensure_user


def _drop_to(user: str) -> None:
    uid = _ensure_user(user)
    os.setgroups([])
    os.setgid(pwd.getpwnam(user).pw_gid)
    os.setuid(uid)


def _request(op: str, args: dict, socket_path: str) -> dict:
    try:
        return {"ok": client.call(op, args, socket_path=Path(socket_path))}
    except IadeepError as exc:
        return {"error": exc.to_dict()}


def as_user(user: str, op: str, args: dict, socket_path: Path) -> dict:
    """Fork, drop to ``user``'s uid, make one real request over the socket, report back."""
    return run_as(user, _request, op, args, str(socket_path))


@pytest.fixture(scope="module")
def lab():
    with shared_dir("iadeep-perm-") as state:   # other accounts must reach the socket inside
        inventory = state / "nodes.yaml"
        inventory.write_text("lab:\n  admins: [iadeep-admin]\nnodes: []\n")
        ctl = ControllerProcess(state / "home", inventory).start()
        yield ctl
        ctl.stop()


def _submit(lab, user):
    sock = lab.home / "controller.sock"
    result = as_user(user, "add", {"spec": {"script": "/bin/true"},
                                   "script_b64": "IyEvYmluL3NoCg=="}, sock)
    return result["ok"]["id"]


def test_identity_is_the_callers_uid(lab):
    sock = lab.home / "controller.sock"
    assert as_user("iadeep-bob", "ping", {}, sock)["ok"] == {"user": "iadeep-bob", "admin": False}
    assert as_user("iadeep-admin", "ping", {}, sock)["ok"]["admin"] is True
    job_id = _submit(lab, "iadeep-alice")
    shown = as_user("iadeep-bob", "show", {"id": job_id}, sock)["ok"]
    assert shown["user"] == "iadeep-alice"


def test_a_request_cannot_claim_another_user(lab):
    sock = lab.home / "controller.sock"
    out = as_user("iadeep-bob", "add", {"spec": {"script": "/bin/true"}, "user": "iadeep-alice"},
                  sock)
    assert out["error"]["type"] == "InputError"  # there is no such field to forge


@pytest.mark.parametrize("op", ["cancel", "hold"])
def test_other_users_cannot_touch_a_job_but_owner_and_admin_can(lab, op):
    sock = lab.home / "controller.sock"
    job_id = _submit(lab, "iadeep-alice")
    [refused] = as_user("iadeep-bob", op, {"ids": [job_id]}, sock)["ok"]
    assert refused["error"]["type"] == "PermissionDenied"
    assert "belongs to iadeep-alice" in refused["error"]["message"]
    assert as_user("iadeep-bob", "priority", {"id": job_id, "priority": 9}, sock)["error"][
        "type"] == "PermissionDenied"
    assert as_user("iadeep-bob", "show", {"id": job_id}, sock)["ok"]["state"] == "queued"
    [done] = as_user("iadeep-admin", op, {"ids": [job_id]}, sock)["ok"]
    assert done["state"] == ("cancelled" if op == "cancel" else "held")


def test_a_member_cannot_requeue_anothers_job_and_its_owner_is_told_why_not_now(lab):
    sock = lab.home / "controller.sock"
    result = as_user("iadeep-alice", "add", {"spec": {"script": "/bin/true", "requeue": True},
                                             "script_b64": "IyEvYmluL3NoCg=="}, sock)
    job_id = result["ok"]["id"]
    [refused] = as_user("iadeep-bob", "requeue", {"ids": [job_id]}, sock)["ok"]
    assert refused["error"]["type"] == "PermissionDenied"
    assert "belongs to iadeep-alice; iadeep-bob may not change it" in refused["error"]["message"]
    for user in ("iadeep-alice", "iadeep-admin"):   # may ask; it is not running (no nodes)
        [answer] = as_user(user, "requeue", {"ids": [job_id]}, sock)["ok"]
        assert answer["error"]["type"] == "InvalidTransition"
        assert answer["error"]["message"] == (f"job {job_id} is queued; only a running job "
                                              "can be requeued")


def test_a_member_may_not_set_idle_after_beyond_the_labs_but_an_admin_may(lab):
    """`--idle-after 365d` would opt a member's job out of the lab's idle_action (default
    30 minutes): refused in one line, through the socket and the CLI; shorter is free, and an
    admin may set any."""
    sock = lab.home / "controller.sock"

    def add(user: str, idle_after_s: float) -> dict:
        return as_user(user, "add", {"spec": {"script": "/bin/true", "idle_after_s": idle_after_s},
                                     "script_b64": "IyEvYmluL3NoCg=="}, sock)

    year = 365 * 86400.0
    refused = add("iadeep-alice", year)["error"]
    assert refused["type"] == "InputError" and refused["message"] == (
        "--idle-after 365d0h: members may set at most the lab's idle_after (30m)"), refused
    code, _, err = cli_as("iadeep-alice", lab.home, "queue", "add", "--idle-after", "365d",
                          "--", "/bin/true")
    assert code == 1 and err.startswith("Error: --idle-after 365d0h: members may set at most "
                                        "the lab's idle_after (30m)"), err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for user, idle_after_s in (("iadeep-alice", 600.0), ("iadeep-alice", 1800.0),
                               ("iadeep-admin", year)):
        assert add(user, idle_after_s)["ok"]["id"] > 0


def test_owner_controls_own_job(lab):
    sock = lab.home / "controller.sock"
    job_id = _submit(lab, "iadeep-alice")
    assert as_user("iadeep-alice", "hold", {"ids": [job_id]}, sock)["ok"][0]["state"] == "held"
    assert as_user("iadeep-alice", "release", {"ids": [job_id]}, sock)["ok"][0]["state"] == "queued"
    assert as_user("iadeep-alice", "cancel", {"ids": [job_id]},
                   sock)["ok"][0]["state"] == "cancelled"


def test_only_admins_reload_the_inventory_and_its_admins_apply_at_once(lab):
    sock = lab.home / "controller.sock"
    refused = as_user("iadeep-bob", "reload", {}, sock)["error"]
    assert refused["type"] == "PermissionDenied"
    assert refused["message"] == "iadeep-bob may not reload the controller's inventory"
    lab.inventory.write_text("lab:\n  admins: [iadeep-admin, iadeep-bob]\nnodes: []\n")
    try:
        done = as_user("iadeep-admin", "reload", {}, sock)["ok"]
        assert done["nodes"] == [] and done["summary"] == "0 nodes (no node changed)"
        assert as_user("iadeep-bob", "ping", {}, sock)["ok"]["admin"] is True
    finally:
        lab.inventory.write_text("lab:\n  admins: [iadeep-admin]\nnodes: []\n")
        assert "ok" in as_user("iadeep-bob", "reload", {}, sock)   # bob is still an admin
    assert as_user("iadeep-bob", "ping", {}, sock)["ok"]["admin"] is False


def cli_as(user: str, home: Path, *argv: str) -> tuple[int, str, str]:
    """Fork, drop to ``user``'s uid, run the real `iadeep ARGV` main; (exit code, out, err)."""
    _ensure_user(user)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        pid = os.fork()
        if pid == 0:  # child: never returns into pytest
            code = 1
            try:
                sys.argv = ["iadeep", *argv]
                sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (child: os._exit)
                # As root first, on an empty state directory (so nothing in ``home`` is
                # touched): the modules the CLI imports lazily load from /root here.
                os.environ["IADEEP_HOME"] = warm = tempfile.mkdtemp()
                _main()
                shutil.rmtree(warm)
                os.environ["IADEEP_HOME"] = str(home)
                _drop_to(user)
                sys.stdout = open(out.fileno(), "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(err.fileno(), "w", closefd=False)  # noqa: SIM115
                code = _main()
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), out.read(), err.read()


def _main() -> int:
    try:
        iadeep_cli.cli.main.main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _submit_with_secret(sock: Path, user: str) -> int:
    spec = {"script": "/bin/true", "env": [["TOKEN", "s3cret-value"]]}
    return as_user(user, "add", {"spec": spec, "script_b64": "IyEvYmluL3NoCg=="}, sock)["ok"]["id"]


def test_env_values_are_shown_to_the_owner_and_admins_only(lab):
    sock = lab.home / "controller.sock"
    job_id = _submit_with_secret(sock, "iadeep-alice")
    seen = {u: as_user(u, "show", {"id": job_id}, sock)["ok"]["env"]
            for u in ("iadeep-alice", "iadeep-admin", "iadeep-bob")}
    assert seen == {"iadeep-alice": {"TOKEN": "s3cret-value"},
                    "iadeep-admin": {"TOKEN": "s3cret-value"}, "iadeep-bob": {"TOKEN": "(hidden)"}}
    listed = as_user("iadeep-bob", "list", {}, sock)["ok"]
    assert "s3cret" not in json.dumps(listed) and job_id in [j["id"] for j in listed]


@pytest.fixture
def stopped_lab():
    """A controller that ran in a shared state directory, accepted alice's job, and stopped."""
    with shared_dir("iadeep-shared-") as top:   # pytest's tmp_path is private to root
        inventory = top / "nodes.yaml"
        inventory.write_text("lab:\n  admins: [iadeep-admin]\nnodes: []\n")
        ctl = ControllerProcess(top / "state", inventory).start()
        job_id = _submit_with_secret(ctl.home / "controller.sock", "iadeep-alice")
        assert ctl.stop() == 0
        yield ctl.home, job_id


def test_after_a_clean_stop_ordinary_users_read_and_see_no_secrets(stopped_lab):
    home, job_id = stopped_lab
    for name in ("iadeep.db", "iadeep.db-wal", "iadeep.db-shm", "scripts"):
        if (home / name).exists():
            assert stat.S_IMODE((home / name).stat().st_mode) & 0o077 == 0, name
    code, out, err = cli_as("iadeep-bob", home, "queue", "list", "--json")
    assert code == 0, err
    [job] = json.loads(out)
    assert (job["id"], job["user"], job["env"]) == (job_id, "iadeep-alice", {"TOKEN": "(hidden)"})
    code, out, err = cli_as("iadeep-bob", home, "status")
    assert code == 0 and "controller: NOT running" in out and "queue: 1 queued" in out, err
    for argv in (["queue", "show", str(job_id)], ["status", "--json"], ["profile", "list"]):
        code, out, err = cli_as("iadeep-bob", home, *argv)
        assert code == 0 and "s3cret" not in out + err, (argv, err)


def test_only_admins_pin_profiles(lab):
    sock = lab.home / "controller.sock"
    refused = as_user("iadeep-bob", "profile_pin", {"label": "resnet50"}, sock)["error"]
    assert refused["type"] == "PermissionDenied" and "iadeep-bob may not" in refused["message"]
    assert as_user("iadeep-admin", "profile_pin", {"label": "resnet50"}, sock)["ok"] == \
        {"label": "resnet50", "pinned_by": "iadeep-admin"}
    profiles = {p["workload"]: p for p in as_user("iadeep-bob", "profiles", {}, sock)["ok"]}
    assert profiles["resnet50"]["pinned_by"] == "iadeep-admin"
    assert as_user("iadeep-bob", "profile_unpin", {"label": "resnet50"}, sock)["error"][
        "type"] == "PermissionDenied"
    assert as_user("iadeep-admin", "profile_pin", {"label": "nosuch"}, sock)["error"][
        "type"] == "NotFoundError"
    assert as_user("iadeep-admin", "profile_unpin", {"label": "resnet50"}, sock)["ok"][
        "pinned_by"] is None

"""Identity comes from the OS (SO_PEERCRED): real second accounts, real uid switches."""
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from controllers import ControllerProcess

USERS = ("iadeep-alice", "iadeep-bob", "iadeep-admin")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true",
    reason="creating OS accounts needs root (CI runs as root)")


def _ensure_user(name: str) -> int:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True)
        return pwd.getpwnam(name).pw_uid


def as_user(user: str, op: str, args: dict, socket_path: Path) -> dict:
    """Fork, drop to ``user``'s uid, make one real request over the socket, report back."""
    uid = _ensure_user(user)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        os.close(read_fd)
        try:
            os.setgroups([])
            os.setgid(pwd.getpwnam(user).pw_gid)
            os.setuid(uid)
            from iadeep_cli.controller import client
            from iadeep_cli.errors import IadeepError
            try:
                out = {"ok": client.call(op, args, socket_path=socket_path)}
            except IadeepError as exc:
                out = {"error": exc.to_dict()}
            os.write(write_fd, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    data = b""
    while chunk := os.read(read_fd, 65536):
        data += chunk
    os.close(read_fd)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture(scope="module")
def lab():
    state = Path(tempfile.mkdtemp(prefix="iadeep-perm-", dir="/tmp"))
    os.chmod(state, 0o755)  # other accounts must reach the socket inside it
    inventory = state / "nodes.yaml"
    inventory.write_text("lab:\n  admins: [iadeep-admin]\nnodes: []\n")
    ctl = ControllerProcess(state / "home", inventory).start()
    yield ctl
    ctl.stop()
    shutil.rmtree(state, ignore_errors=True)


def _submit(lab, user):
    sock = lab.home / "controller.sock"
    result = as_user(user, "add", {"spec": {"script": "/bin/true"}, "script_b64": "IyEvYmluL3NoCg=="}, sock)
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


def test_owner_controls_own_job(lab):
    sock = lab.home / "controller.sock"
    job_id = _submit(lab, "iadeep-alice")
    assert as_user("iadeep-alice", "hold", {"ids": [job_id]}, sock)["ok"][0]["state"] == "held"
    assert as_user("iadeep-alice", "release", {"ids": [job_id]}, sock)["ok"][0]["state"] == "queued"
    assert as_user("iadeep-alice", "cancel", {"ids": [job_id]}, sock)["ok"][0]["state"] == "cancelled"


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

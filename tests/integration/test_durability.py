"""A sick state directory: full (a real small tmpfs), its database deleted or replaced (a real
controller process). The controller degrades and says why; it never exits, never starts over
silently, and loses no accepted job."""
import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.controllers import ControllerProcess, cli, jobs_by_id, queue_add, wait_until
from iadeep_cli.errors import StoreError
from iadeep_cli.paths import StateDir
from iadeep_cli.store import Store, cluster, statedir

ROOT = Path(__file__).resolve().parents[2]
FULL = "the controller's state directory is full"


@pytest.fixture
def small_fs(tmp_path):
    """A real 32 MiB filesystem (tmpfs) to fill up."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "tmpfs",
                           str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()} "
                    "(needs root with CAP_SYS_ADMIN)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def _fill(directory: Path, leave: int = 0) -> Path:
    """Write a file until only ``leave`` bytes are free (0: until ENOSPC)."""
    filler = directory / f"filler-{leave}"
    with open(filler, "wb", buffering=0) as f:
        while True:
            st = os.statvfs(directory)
            room = st.f_bavail * st.f_frsize - leave
            if room <= 0:
                break
            try:
                f.write(b"\0" * min(room, 1 << 20))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    return filler


# ------------------------------------------------------------------ full
@pytest.mark.os_global   # mounts a tmpfs (the mount table is the machine's)
def test_a_full_filesystem_is_one_clear_error_and_the_store_recovers(small_fs):
    store = Store(small_fs / "iadeep.db")
    filler = _fill(small_fs)
    big = "x" * 2_000_000   # needs new pages, which a full disk cannot give
    with pytest.raises(StoreError, match=f"{FULL} \\({small_fs}\\)") as caught, store.tx() as conn:
        cluster.set_meta(conn, "big", big)
    assert caught.value.hint == f"free space in {small_fs}"
    # a script copy that does not fit: same error
    with pytest.raises(StoreError, match=FULL), store.tx() as conn:
        cluster.set_meta(conn, "small", 1)
        (small_fs / "script").write_bytes(b"#" * 1_000_000)
    filler.unlink()
    with store.tx() as conn:   # the connection is usable again, nothing half-written
        assert cluster.get_meta(conn, "small") is None
        cluster.set_meta(conn, "big", big)
    with store.tx() as conn:
        assert cluster.get_meta(conn, "big") == big
    store.close()


@pytest.mark.os_global   # mounts a tmpfs (the mount table is the machine's)
def test_a_full_state_directory_degrades_the_controller_and_it_recovers(
        sshd_cluster, small_fs, tmp_path):
    node = next(iter(sshd_cluster(1).nodes.values()))
    node.set_fake(gpus=1)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n" + sshd_cluster(1).inventory_yaml())
    ctl = ControllerProcess(small_fs / "state", inventory)
    ctl.log = tmp_path / "controller.log"   # not on the filesystem we fill
    ctl.start()
    home = ctl.home
    try:
        def add(*args):
            return queue_add(home, str(ROOT / "jobs/hello.sh"), "--exclusive", *args)
        running, waiting = add("--env", "SLEEP_S=600"), add("--env", "SLEEP_S=0")
        wait_until(lambda: jobs_by_id(home)[running]["state"] == "running", limit=120)
        low = _fill(small_fs, leave=statedir.RESERVE_BYTES // 2)

        def degraded():
            status = json.loads(cli(home, "status", "--json", check=True).stdout)
            return status["live"] and status["controller"].get("degraded")
        assert FULL in wait_until(degraded, limit=120)["message"]
        refused = cli(home, "queue", "add", str(ROOT / "jobs/hello.sh"))
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1
        assert refused.stderr.startswith(f"Error: {FULL} ({home})") and \
            refused.stderr.rstrip().endswith(f"(hint: free space in {home})")
        # What it accepted is still scheduled, run and recorded (from the reserve).
        assert jobs_by_id(home)[waiting]["state"] == "queued"
        cli(home, "queue", "cancel", str(running), check=True)
        wait_until(lambda: jobs_by_id(home)[waiting]["state"] == "succeeded", limit=120)

        last = _fill(small_fs)   # now nothing at all is left
        wait_until(lambda: "scheduling round stopped: " + FULL in ctl.log.read_text(),
                   limit=30)
        assert ctl.proc.poll() is None and degraded()
        last.unlink()
        low.unlink()
        wait_until(lambda: not degraded(), limit=120)
        later = add("--env", "SLEEP_S=0")
        wait_until(lambda: jobs_by_id(home)[later]["state"] == "succeeded", limit=120)
        states = {i: j["state"] for i, j in jobs_by_id(home).items()}
        assert states == {1: "cancelled", 2: "succeeded", 3: "succeeded"}
        assert "state directory healthy again" in ctl.log.read_text()
    finally:
        ctl.stop()


# ------------------------------------------------------------------ removed or replaced
def _controller(tmp_path) -> ControllerProcess:
    tmp_path.mkdir(exist_ok=True)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\nnodes: []\n")
    return ControllerProcess(tmp_path / "state", inventory)


def _start_refused(ctl: ControllerProcess, *flags: str) -> str:
    done = cli(ctl.home, "controller", "run", "--inventory", str(ctl.inventory), *flags)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_a_database_deleted_under_a_running_controller_is_detected_and_kept(tmp_path):
    ctl = _controller(tmp_path).start()
    home, db = ctl.home, ctl.home / "iadeep.db"
    try:
        ids = [queue_add(home, "/bin/true") for _ in range(2)]
        install = (home / "install_id").read_text().strip()
        db.unlink()
        refused = cli(home, "queue", "add", "/bin/true")
        assert refused.returncode == 1 and refused.stderr.startswith(
            f"Error: the controller's database {db} was removed or replaced while it ran")
        assert "was removed or replaced" in cli(home, "queue", "list").stderr
        wait_until(lambda: "saved what the controller held" in ctl.log.read_text())
        assert ctl.proc.poll() is None
    finally:
        assert ctl.stop() == 0
    assert not db.exists()   # it never wrote a new, empty one

    refused = _start_refused(ctl)
    assert refused.startswith(f"Error: the state database {db} is missing, but this state "
                              f"directory had one (install {install})")
    assert f"move {db}.rescued" in refused and "--new-database" in refused
    (home / "iadeep.db.rescued").rename(db)
    ctl.start()
    try:
        later = queue_add(home, "/bin/true")
        assert sorted(jobs_by_id(home)) == [*ids, later] == [1, 2, 3]
    finally:
        ctl.stop()


def test_a_replaced_database_is_refused_until_started_fresh_deliberately(tmp_path):
    other = _controller(tmp_path / "other").start()
    cli(other.home, "queue", "add", "/bin/true", check=True)
    other.stop()
    ctl = _controller(tmp_path).start()
    home, db = ctl.home, ctl.home / "iadeep.db"
    cli(home, "queue", "add", "/bin/true", check=True)
    ours = (home / "install_id").read_text().strip()
    shutil.copy(other.home / "iadeep.db", tmp_path / "foreign.db")
    os.replace(tmp_path / "foreign.db", db)   # replaced while it runs
    assert "was removed or replaced" in cli(home, "queue", "add", "/bin/true").stderr
    ctl.stop()

    theirs = (other.home / "install_id").read_text().strip()
    assert f"belongs to install {theirs}, but this state directory's is install {ours}" in \
        _start_refused(ctl)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    assert "is missing" in _start_refused(ctl)
    fresh = ControllerProcess(home, ctl.inventory, "--new-database").start()
    try:
        assert (home / "install_id").read_text().strip() not in (ours, theirs)
        assert cli(home, "queue", "add", "/bin/true", check=True).stdout.strip() == "1"
    finally:
        fresh.stop()


def test_start_up_adopts_an_older_database_and_marks_the_directory(tmp_path):
    """A database from before the marker existed is this directory's: adopted, not refused."""
    home = tmp_path / "state"
    home.mkdir()
    old = Store(home / "iadeep.db")
    with old.tx() as conn:
        cluster.set_meta(conn, "install_id", "abc123")
    old.close()
    store, install = statedir.open_store(StateDir(home))
    store.close()
    assert install == "abc123" and (home / "install_id").read_text() == "abc123\n"
    store, again = statedir.open_store(StateDir(home))
    store.close()
    assert again == "abc123"

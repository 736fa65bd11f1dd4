"""``run_as: submitter`` with real parts: OS accounts, an sshd node logged into as an
unprivileged SSH account, real sudo with the sudoers line of docs/security.md, a real controller,
and the real CLI run as each user (issue 12, "Run as the submitter")."""
from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.accounts import accounts_lock, cli_as, cli_as_uid, ensure_user, unused_uid
from helpers.controllers import cli, jobs_by_id, wait_until
from helpers.runas_lab import RunAsLab, account, install_sudoers, need_tools
from iadeep_cli.paths import StateDir

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.os_global,   # accounts changed and removed, a sudoers file, /home/<account>
    pytest.mark.skipif(os.geteuid() != 0, reason="creating OS accounts and sudo rules needs root"),
]

LAB = RunAsLab("ra")
CTL, (ALICE, BOB), GROUP = LAB.ctl, LAB.users, LAB.group
GHOST = "iadeep-ra-ghost"


@pytest.fixture(scope="module")
def lab():
    need_tools()
    with accounts_lock():   # a left-over from a killed run
        subprocess.run(["userdel", GHOST], capture_output=True)
    try:
        with LAB.running("ra1", "127.0.0.41", (
                f"  poll_interval: 0.5\n  node_grace: 30\n  admins: []\n"
                f"  allowed_users: [{GHOST}]\n  user_limits: {{{GHOST}: {{max_jobs: 0}}}}\n")
                ) as ctl:
            yield ctl
    finally:
        subprocess.run(["userdel", GHOST], capture_output=True)


def _script(lab, name: str, body: str) -> str:
    path = lab.scripts / name
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def _job(lab, job_id: int) -> dict:
    return jobs_by_id(lab.home)[job_id]


def _submitted(result: dict) -> int:
    assert result["rc"] == 0, result
    return int(re.search(r"\b(\d+)\b", result["out"]).group(1))


# The job says who it runs as, leaves a file in its owner's home, and waits (bounded) for the
# test to let it finish, so that others can try to read and cancel it while it runs.
JOB = """#!/bin/sh
echo "whoami: $(id -un)"
echo made > "$HOME/ra-made-$IADEEP_JOB_ID"
n=0; while [ ! -e "$HOME/ra-go-$IADEEP_JOB_ID" ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done
echo done
"""


def test_a_job_runs_as_its_submitter_and_only_they_see_its_log(lab):
    home = pwd.getpwnam(ALICE).pw_dir
    job_id = _submitted(cli_as(ALICE, lab.home, "queue", "add", _script(lab, "a.sh", JOB)))
    wait_until(lambda: os.path.exists(f"{home}/ra-made-{job_id}"), limit=120)
    made = os.stat(f"{home}/ra-made-{job_id}")
    assert pwd.getpwuid(made.st_uid).pw_name == ALICE
    jdir = Path(home, ".iadeep", StateDir(lab.home).install_id.read_text().strip(), "ra1", "jobs",
                str(job_id))
    assert (jdir.stat().st_mode & 0o777, pwd.getpwuid(jdir.stat().st_uid).pw_name) == \
        (0o700, ALICE)
    assert pwd.getpwuid((jdir / "log").stat().st_uid).pw_name == ALICE
    wait_until(lambda: _job(lab, job_id)["state"] == "running", limit=120)

    # bob can neither read alice's log through iadeep nor cancel her job
    refused = cli_as(BOB, lab.home, "logs", str(job_id))
    assert refused["rc"] == 1 and f"belongs to {ALICE}" in refused["err"], refused
    assert "whoami" not in refused["out"] + refused["err"]
    refused = cli_as(BOB, lab.home, "queue", "cancel", str(job_id))
    assert refused["rc"] != 0 and f"belongs to {ALICE}" in refused["out"] + refused["err"]

    Path(f"{home}/ra-go-{job_id}").touch()
    wait_until(lambda: _job(lab, job_id)["state"] == "succeeded", limit=120)
    log = cli_as(ALICE, lab.home, "logs", str(job_id))
    assert log["rc"] == 0 and f"whoami: {ALICE}\n" in log["out"] and "done" in log["out"], log


def test_the_owner_cancels_their_own_running_job(lab):
    job_id = _submitted(cli_as(BOB, lab.home, "queue", "add", _script(lab, "b.sh", JOB)))
    wait_until(lambda: _job(lab, job_id)["state"] == "running", limit=120)
    assert cli_as(BOB, lab.home, "queue", "cancel", str(job_id))["rc"] == 0
    wait_until(lambda: _job(lab, job_id)["state"] == "cancelled", limit=120)


def test_a_job_for_a_user_missing_on_the_node_fails_with_the_reason(lab):
    """The ghost submits (the controller knows them) and its job waits (max_jobs: 0); the
    account is then gone from the node: the launch fails saying so, and nothing ran."""
    ensure_user(GHOST)
    job_id = _submitted(cli_as(GHOST, lab.home, "queue", "add",
                               _script(lab, "g.sh", "#!/bin/sh\necho hi\n")))
    with accounts_lock():
        subprocess.run(["userdel", GHOST], check=True)
    lab.inventory.write_text(re.sub(r"  user_limits:.*\n", "", lab.inventory.read_text()))
    assert cli(lab.home, "controller", "reload").returncode == 0
    wait_until(lambda: _job(lab, job_id)["state"] == "failed", limit=120)
    why = cli(lab.home, "queue", "show", str(job_id), "--json", check=True).stdout
    reason = json.loads(why)["reason"]
    assert f"user {GHOST} does not exist on this node" in reason, reason


def test_nodes_check_says_whether_run_as_works(lab):
    ok = cli(lab.home, "nodes", "check", "--inventory", str(lab.inventory))
    assert ok.returncode == 0 and "run_as: submitter ok" in ok.stdout, ok.stdout + ok.stderr
    saved = LAB.sudoers.read_text()
    LAB.sudoers.unlink()
    try:
        bad = cli(lab.home, "nodes", "check", "--inventory", str(lab.inventory), "--json")
        [node] = json.loads(bad.stdout)
        assert bad.returncode == 1 and node["run_as"]["ok"] is False
        assert "a password is required" in node["run_as"]["error"], node
        # the line to add, with the node's SSH account and the users it may run as
        assert f"add `{CTL} ALL=(%{GROUP},{GHOST},!root) NOPASSWD: /bin/sh` there" in \
            node["run_as"]["error"], node
    finally:
        install_sudoers(LAB.sudoers, saved.strip())


def test_queue_why_says_sudo_refused_the_launch_and_when_it_is_tried_again(lab):
    """The node answers but sudo refuses (its rule is gone): `queue why` names the refusal and
    when the node is tried again, not a node that is down."""
    saved = LAB.sudoers.read_text()
    LAB.sudoers.unlink()
    try:
        job_id = _submitted(cli_as(ALICE, lab.home, "queue", "add",
                                   _script(lab, "w.sh", "#!/bin/sh\necho hi\n")))

        def why() -> str:
            out = cli_as(ALICE, lab.home, "queue", "why", str(job_id))["out"]
            return out if "skipped until" in out else ""
        said = wait_until(why, limit=120)
        assert f"job {job_id} is queued: node ra1 is skipped until " in said, said
        assert "its last launch failed: node ra1 cannot run jobs as their submitters" in said
        assert "password is required" in said and "no node answered" not in said, said
        assert f"add `{CTL} ALL=(%{GROUP}," in said, said
    finally:
        install_sudoers(LAB.sudoers, saved.strip())
    assert cli_as(ALICE, lab.home, "queue", "cancel", str(job_id))["rc"] == 0


def test_sudo_never_runs_as_root_with_the_documented_line(lab):
    """The rule itself refuses root, whatever iadeep's own checks do."""
    out = subprocess.run(["su", CTL, "-s", "/bin/sh", "-c", "sudo -n -u root -- /bin/sh -c id"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "uid=0" not in out.stdout
    out = subprocess.run(["su", CTL, "-s", "/bin/sh", "-c",
                          f"sudo -n -u {ALICE} -- /bin/sh -c 'id -un'"],
                         capture_output=True, text=True)
    assert out.stdout.strip() == ALICE, out.stderr


def test_adaptation_suspends_and_resumes_a_job_as_its_owner(lab):
    """Run-time adaptation's SIGSTOP/SIGCONT (``Backend.suspend``/``resume``) reach a job on a
    ``run_as: submitter`` node through the owner's sudo, as cancel does: every process of it
    stopped, then continued, and the job still ends normally. Another user's identity reaches
    nothing."""
    from helpers.controllers import attempt_processes, process_states
    from iadeep_cli.controller.runtime import _scoped_workdirs
    from iadeep_cli.inventory import load_inventory
    from iadeep_cli.nodes.poller import NodePool

    def states() -> set[str]:   # the job's `sleep 0.1`s come and go (and may be zombies)
        return process_states(attempt_processes(job_id, "ra1", lab.home))

    home = pwd.getpwnam(ALICE).pw_dir
    job_id = _submitted(cli_as(ALICE, lab.home, "queue", "add", _script(lab, "p.sh", JOB)))
    wait_until(lambda: _job(lab, job_id)["state"] == "running", limit=120)
    install = StateDir(lab.home).install_id.read_text().strip()
    inventory = _scoped_workdirs(load_inventory(lab.inventory), install)
    with NodePool(inventory, known_hosts=[lab.home / "known_hosts"], connect_timeout=3,
                  command_timeout=10, backoff_base=0) as pool:
        assert pool.backend("ra1").resume(job_id, owner=BOB) is False
        assert pool.backend("ra1").suspend(job_id, owner=ALICE) is True
        wait_until(lambda: states() == {"T"}, limit=10)
        assert pool.backend("ra1").resume(job_id, owner=ALICE) is True
        wait_until(lambda: states() and "T" not in states(), limit=10)
    Path(f"{home}/ra-go-{job_id}").touch()
    wait_until(lambda: _job(lab, job_id)["state"] == "succeeded", limit=120)


def _scan_for(stop: str, secrets: list[str]) -> dict:
    """Runs as another account: reads every process's command line (world-readable) and, where
    it may, its environment, over and over until ``stop`` exists; what held a secret."""
    me, passes, seen, hits = os.getpid(), 0, set(), []
    wanted = [s.encode() for s in secrets]
    while not os.path.exists(stop):
        passes += 1
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == me:
                continue
            for part in ("cmdline", "environ"):
                try:
                    with open(f"/proc/{pid}/{part}", "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                seen.add(pid)
                hits += [f"{pid} {part}: {data[:120]!r}" for s in wanted if s in data]
    return {"passes": passes, "processes": len(seen), "hits": hits[:10]}


def test_env_values_never_show_in_a_command_line_on_the_node(lab):
    """Another member scans every /proc/PID/cmdline (and any environment it may read) on the
    node while jobs with secret --env values launch as their owner: the values travel on the
    launch's standard input, so none shows, and each still reaches its job."""
    from helpers.accounts import AsUser

    secrets = [f"s3cret-{os.getpid()}-{i}" for i in range(4)]
    stop = lab.top / "scan-stop"
    stop.unlink(missing_ok=True)
    warm = _script(lab, "env.sh", '#!/bin/sh\necho "value=$TOKEN"\n')
    scanner = AsUser(BOB, _scan_for, str(stop), secrets)
    try:
        ids = [_submitted(cli_as(ALICE, lab.home, "queue", "add", "--env", f"TOKEN={s}",
                                 warm)) for s in secrets]
        for job_id in ids:
            wait_until(lambda j=job_id: _job(lab, j)["state"] == "succeeded", limit=120)
    finally:
        stop.touch()
        found = scanner.result()
    assert found["passes"] > 0 and found["processes"] > 0, found
    assert found["hits"] == [], found
    for job_id, secret in zip(ids, secrets):
        log = cli_as(ALICE, lab.home, "logs", str(job_id))
        assert log["rc"] == 0 and f"value={secret}\n" in log["out"], log


OUTSIDER = "iadeep-ra-out"   # a real account in neither allowed_users nor the lab's group


def test_who_may_never_run_is_refused_at_submission_arrays_included(lab):
    """On a lab whose only node runs jobs as their submitters: an account outside
    allowed_users and the group, root, and a uid without an account are refused when they
    submit (a 10,000-task array too), with one line saying why; nothing is queued."""
    account(OUTSIDER)
    script = _script(lab, "o.sh", "#!/bin/sh\necho hi\n")
    before = set(jobs_by_id(lab.home))
    out = cli_as(OUTSIDER, lab.home, "queue", "add", "--array", "0-9999", script)
    assert out["rc"] == 1 and "Traceback" not in out["err"], out
    assert (f"{OUTSIDER} may not run jobs on any node this job could use" in out["err"]
            and f"neither in allowed_users nor in group {GROUP}" in out["err"]), out
    root = cli(lab.home, "queue", "add", script)
    assert root.returncode == 1 and "root is never run as" in root.stderr, root.stderr
    unused = unused_uid()
    ghost = cli_as_uid(unused, lab.home, "queue", "add", script)
    assert ghost["rc"] == 1 and f"uid{unused} has no account" in ghost["err"], ghost
    assert set(jobs_by_id(lab.home)) == before
    # a member of the group is admitted as before
    member = _submitted(cli_as(BOB, lab.home, "queue", "add", script))
    wait_until(lambda: _job(lab, member)["state"] == "succeeded", limit=120)


def test_a_member_may_raise_priority_only_up_to_the_lab_cap(lab):
    """lab.max_priority (default 10) bounds what a member sets, at submission and later;
    lowering is free, and an admin (root here) may go above."""
    home = pwd.getpwnam(ALICE).pw_dir
    too_high = cli_as(ALICE, lab.home, "queue", "add", "--priority", "1000000",
                      _script(lab, "h.sh", JOB))
    assert too_high["rc"] == 1 and "Traceback" not in too_high["err"], too_high
    assert "--priority 1000000: members may set at most 10 (lab.max_priority)" in \
        too_high["err"], too_high
    job_id = _submitted(cli_as(ALICE, lab.home, "queue", "add", "--priority", "10",
                               _script(lab, "h.sh", JOB)))
    try:
        raised = cli_as(ALICE, lab.home, "queue", "priority", str(job_id), "11")
        assert raised["rc"] == 1 and "members may set at most 10" in raised["err"], raised
        assert cli_as(ALICE, lab.home, "queue", "priority", str(job_id), "-50")["rc"] == 0
        assert cli(lab.home, "queue", "priority", str(job_id), "1000000").returncode == 0
        assert _job(lab, job_id)["priority"] == 1000000
    finally:
        Path(f"{home}/ra-go-{job_id}").touch()
    wait_until(lambda: _job(lab, job_id)["state"] == "succeeded", limit=120)


def test_an_owner_whose_home_takes_no_files_holds_only_their_own_job(lab):
    """Alice's home on the node is not writable: her launch fails in her own files, so her job
    is held with the reason (hers to fix), and the node is not taken out of scheduling: Bob's
    job, submitted after hers failed, starts on it at once."""
    home = Path(pwd.getpwnam(ALICE).pw_dir)
    shutil.rmtree(home / ".iadeep", ignore_errors=True)
    # the lab's controller is the module's: earlier tests (a sudo refusal) back the node off
    # by design, so only what this test's launches log counts
    log_from = len(lab.log.read_text())
    home.chmod(0o500)
    try:
        hers = _submitted(cli_as(ALICE, lab.home, "queue", "add",
                                 _script(lab, "full.sh", "#!/bin/sh\necho never\n")))
        wait_until(lambda: _job(lab, hers)["state"] == "held", limit=120)
        why = cli_as(ALICE, lab.home, "queue", "why", str(hers))
        assert why["rc"] == 0 and f"in {ALICE}'s home on node ra1" in why["out"], why
        assert f"iadeep queue release {hers}" in why["out"], why
        his = _submitted(cli_as(BOB, lab.home, "queue", "add",
                                _script(lab, "quick.sh", "#!/bin/sh\necho quick\n")))
        wait_until(lambda: _job(lab, his)["state"] == "succeeded", limit=120)
        # the node was never backed off for her files
        assert "is skipped for" not in lab.log.read_text()[log_from:]
        events = json.loads(cli(lab.home, "queue", "show", str(his), "--json",
                                check=True).stdout)["events"]
        waited = next(e["at"] for e in events if e["new_state"] == "running") - events[0]["at"]
        print(f"measured: bob's job started {waited:.2f} s after submission (poll 0.5 s)")
        assert _job(lab, hers)["state"] == "held" and _job(lab, hers)["attempts"] == 0
        # Fixed, released: it runs.
        home.chmod(0o700)
        assert cli_as(ALICE, lab.home, "queue", "release", str(hers))["rc"] == 0
        wait_until(lambda: _job(lab, hers)["state"] == "succeeded", limit=120)
    finally:
        home.chmod(0o700)


def test_an_output_the_node_account_cannot_write_fails_the_job_saying_why(lab):
    """A node whose jobs run as its SSH account (run_as: account) and a member's --output in
    their own home, which that account cannot write (a lab set up with shared_paths: [/home]
    on such a node): the job fails before it runs, its reason carries the shell's
    "Permission denied", and `iadeep logs` shows the job directory's log, not "may not have
    started yet"."""
    from helpers.sshd import SshdNode

    home = pwd.getpwnam(ALICE).pw_dir
    saved, known = lab.inventory.read_text(), lab.home / "known_hosts"
    saved_known = known.read_text()
    key = re.search(r"identity_file: (\S+)", saved).group(1)
    workdir = re.search(r"workdir: (\S+)", saved).group(1)
    node = SshdNode("ra2", "127.0.0.42", lab.top, lab.top / "authorized_keys")
    try:
        node.start()
        known.write_text(saved_known + node.known_hosts_line() + "\n")
        lab.inventory.write_text(
            saved + f"  - name: ra2\n    host: {node.addr}\n    port: {node.port}\n"
            f"    user: {CTL}\n    identity_file: {key}\n    workdir: {workdir}\n"
            f"    run_as: account\n")
        assert cli(lab.home, "controller", "reload").returncode == 0
        job_id = _submitted(cli_as(ALICE, lab.home, "queue", "add", "--nodelist", "ra2",
                                   "--output", f"{home}/out-%j.txt",
                                   _script(lab, "o.sh", "#!/bin/sh\necho the-job-ran\n")))
        wait_until(lambda: _job(lab, job_id)["state"] == "failed", limit=120)
        job = _job(lab, job_id)
        assert job["node"] == "ra2", job
        assert job["reason"] == (f"could not open its output (exit code 122): cannot create "
                                 f"{home}/out-{job_id}.txt: Permission denied"), job["reason"]
        log = cli_as(ALICE, lab.home, "logs", str(job_id))
        assert log["rc"] == 0 and "Traceback" not in log["err"], log
        assert (f"iadeep: cannot open the job's output: cannot create {home}/out-{job_id}.txt: "
                "Permission denied") in log["out"] and "the-job-ran" not in log["out"], log
        assert not os.path.exists(f"{home}/out-{job_id}.txt")
    finally:
        lab.inventory.write_text(saved)
        known.write_text(saved_known)
        cli(lab.home, "controller", "reload")
        node.stop()


def test_run_pty_bash_in_tmux_is_a_shell_as_the_submitter_on_their_gpu(lab, tmp_path):
    """`iadeep run --pty bash`, typed into in a real tmux pane as a lab member would: the shell
    runs on the node as its submitter, sees its GPU, and `exit` ends the job `succeeded`."""
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux (apt install tmux)")
    helper = Path(__file__).resolve().parents[1] / "helpers" / "cli_as_user.py"
    socket = f"iadeep-pty-{os.getpid()}"
    tmux = ["tmux", "-L", socket]
    done = tmp_path / "status"
    command = " ".join(shlex.quote(a) for a in (sys.executable, str(helper), ALICE, str(lab.home),
                                                "run", "--pty", "bash", "--norc"))
    subprocess.run([*tmux, "new-session", "-d", "-s", "pty", "-x", "120", "-y", "40",
                    f"{command}; echo $? > {done}; sleep 600"], check=True)
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "pty", "-S", "-100"],
                                  capture_output=True, text=True).stdout

        job = wait_until(lambda: next((j for j in jobs_by_id(lab.home).values()
                                       if j["state"] != "queued" and j["user"] == ALICE
                                       and j["script"].endswith("/run.sh")), None), limit=120)
        job = wait_until(lambda: (j := _job(lab, job["id"]))["state"] != "starting" and j,
                         limit=120)
        assert job["state"] == "running" and job["node"] == "ra1", \
            (job, cli_as(ALICE, lab.home, "logs", str(job["id"])), screen())
        subprocess.run([*tmux, "send-keys", "-t", "pty", "echo gpu=$CUDA_VISIBLE_DEVICES; "
                        "echo user=$(whoami)", "Enter"], check=True)
        try:
            wait_until(lambda: "user=" + ALICE in screen(), limit=120)
        except AssertionError:
            raise AssertionError(screen().strip() + repr(cli_as(ALICE, lab.home, "logs",
                                                        str(job["id"])))) from None
        assert f"gpu={job['gpu_indices'][0]}" in screen(), screen()
        subprocess.run([*tmux, "send-keys", "-t", "pty", "exit", "Enter"], check=True)
        wait_until(lambda: done.exists() and done.read_text().strip() == "0", limit=120)
        wait_until(lambda: _job(lab, job["id"])["state"] == "succeeded", limit=120)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)

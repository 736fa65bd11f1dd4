"""End to end: a real controller, a real sshd node, jobs submitted with the CLI, and their
notifications arriving at an SMTP server (aiosmtpd) and a webhook (http.server) started here.
The webhook first hangs, then fails: the controller keeps scheduling, and retries it."""
from __future__ import annotations

import getpass
import json
import signal
import sqlite3

from helpers.controllers import cli, jobs_by_id, queue_add, start_lab, wait_until
from helpers.sinks import HookSink, MailSink

FINISHED = {"succeeded", "failed", "cancelled"}


def _script(tmp_path, name: str, body: str):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    return path


def test_finished_jobs_are_announced_by_mail_and_webhook(sshd_cluster, tmp_path):
    user = getpass.getuser()
    with MailSink() as mail, HookSink(fail_first=1) as hook:
        hook.hold.clear()                        # the webhook hangs until the test lets it go
        cluster = sshd_cluster(1)
        for node in cluster.nodes.values():
            node.set_fake(gpus=1)
        inventory = tmp_path / "nodes.yaml"
        inventory.write_text(
            "lab:\n  poll_interval: 0.3\n  node_grace: 3\n  notify:\n    default: fail\n"
            f"    smtp: {mail.address}\n    address: '{{user}}@lab.example.org'\n"
            f"    webhook: {hook.url}\n" + cluster.inventory_yaml())
        ctl = start_lab(cluster, tmp_path, inventory)
        home = ctl.home
        try:
            noisy = _script(tmp_path, "noisy.sh",
                            'for i in $(seq 1 40); do echo "line $i"; done\n'
                            "printf 'red \\033[31malert\\033[0m\\n'\nexit 3\n")
            failed = queue_add(home, str(noisy), "--name", "noisy")     # the lab default: fail
            wait_until(lambda: hook.got()[0], limit=120)            # its webhook call hangs...
            ok = queue_add(home, str(_script(tmp_path, "ok.sh", "echo fine\n")), "--notify", "end")
            quiet = queue_add(home, str(_script(tmp_path, "quiet.sh", "echo shh\n")))
            jobs = wait_until(lambda: (lambda js: js if all(
                js[i]["state"] in FINISHED for i in (failed, ok, quiet)) else None)(
                    jobs_by_id(home)), limit=90)                   # ...and jobs still run
            assert [jobs[i]["state"] for i in (failed, ok, quiet)] == \
                ["failed", "succeeded", "succeeded"]
            assert [jobs[i]["notify"] for i in (failed, ok, quiet)] == ["fail", "end", "fail"]
            wait_until(lambda: len(mail.received()) == 2, limit=120)
            assert hook.got()[1] == []
            hook.hold.set()          # it answers 500 once, then the retry gets through
            # (a set: on a slow machine the hung call may also time out on our side and be
            # retried, so the webhook may see the same message more than once; at least once)
            wait_until(lambda: {b["job"]["id"] for b in hook.got()[1]} == {failed, ok}, limit=90)
        finally:
            ctl.stop()

    by_subject = {m["Subject"]: m for m in mail.received()}
    assert set(by_subject) == {f"[iadeep] job {failed} (noisy) failed",
                               f"[iadeep] job {ok} (ok.sh) succeeded"}
    msg = by_subject[f"[iadeep] job {failed} (noisy) failed"]
    assert msg["To"] == f"{user}@lab.example.org"
    body = msg.get_content().replace("\r\n", "\n")
    node = jobs[failed]["node"]
    assert f"Job {failed} (noisy) of {user} failed: exited with code 3" in body
    assert "  exit code: 3" in body and f"  node:      {node} (GPU 0)" in body
    assert "  line 40\n  red \\x1b[31malert\\x1b[0m\n" in body    # the log's end, from the node
    assert "line 20\n" not in body and "\x1b" not in body
    requests, accepted = hook.got()
    assert [b["job"]["id"] for b in requests].count(failed) >= 2   # 500, then the retry
    hooked = next(b for b in accepted if b["job"]["id"] == failed)
    assert hooked["job"]["exit_code"] == 3 and hooked["event"] == "end"
    assert hooked["text"].startswith(f"Job {failed} (noisy) of {user} failed")
    log = ctl.log.read_text()
    assert f"notifying {user} of job {failed} by webhook failed (try 1 of 5)" in log
    assert "secret-token" not in log
    shown = json.loads(cli(home, "queue", "show", str(ok), "--json", check=True).stdout)
    assert shown["notify"] == "end"


def test_notify_without_a_channel_is_refused_at_submission(sshd_cluster, tmp_path):
    cluster = sshd_cluster(1)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("lab:\n  poll_interval: 0.3\n  node_grace: 3\n" +
                         cluster.inventory_yaml())
    ctl = start_lab(cluster, tmp_path, inventory)
    try:
        script = _script(tmp_path, "x.sh", "true\n")
        proc = cli(ctl.home, "queue", "add", str(script), "--notify", "fail")
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert "--notify fail: no notification channel of this lab reaches" in proc.stderr
        bad = cli(ctl.home, "queue", "add", str(script), "--notify", "always")
        assert bad.returncode != 0 and "--notify must be one of end, fail, all, none" in bad.stderr
        fine = queue_add(ctl.home, str(script), "--notify", "none")
        assert jobs_by_id(ctl.home)[fine]["notify"] == "none"
    finally:
        ctl.stop()


def test_a_notification_owed_when_the_controller_is_killed_is_sent_once_after(sshd_cluster,
                                                                               tmp_path):
    """The mail server is down when the job ends; the controller is SIGKILLed while the
    message waits for its retry; the restarted controller sends it, once."""
    mail = MailSink()                            # its port is chosen; it is not listening yet
    cluster = sshd_cluster(1)
    for node in cluster.nodes.values():
        node.set_fake(gpus=1)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text(
        "lab:\n  poll_interval: 0.3\n  node_grace: 3\n  notify:\n    default: end\n"
        f"    smtp: {mail.address}\n    address: '{{user}}@lab.example.org'\n" +
        cluster.inventory_yaml())
    ctl = start_lab(cluster, tmp_path, inventory)
    try:
        job = queue_add(ctl.home, str(_script(tmp_path, "ok.sh", "echo done\n")))
        wait_until(lambda: f"of job {job} by email failed (try 1 of 5)" in ctl.log.read_text(),
                   limit=90)
        ctl.kill(signal.SIGKILL)
        with mail:
            ctl.start()
            wait_until(mail.received, limit=120)
            wait_until(lambda: _outbox(ctl.home, job)[0]["sent_at"] is not None, limit=120)
            [row] = _outbox(ctl.home, job)
            assert row["attempts"] == 2 and row["channel"] == "email"
            [msg] = mail.received()
            assert msg["Subject"] == f"[iadeep] job {job} (ok.sh) succeeded"
    finally:
        ctl.stop()


def _outbox(home, job_id) -> list[dict]:
    conn = sqlite3.connect(f"file:{home / 'iadeep.db'}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(
            "SELECT * FROM outbox WHERE job_id=?", (job_id,))]
    finally:
        conn.close()

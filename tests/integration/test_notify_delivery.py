"""The notifier against real servers: an SMTP server (aiosmtpd) and an HTTP server on
127.0.0.1, over a real store. Jobs are moved through their states as the loop moves them; the
node's log is a string here (the end-to-end test reads a real one over SSH)."""
from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from helpers.controllers import wait_until
from helpers.sinks import DripSink, HookSink, MailSink, free_port
from iadeep_cli.controller.notify import Notifier
from iadeep_cli.jobs import JobSpec, JobState
from iadeep_cli.settings import NotifySettings
from iadeep_cli.store import Store, jobrows, outbox

S = JobState
LOG = "".join(f"step {i}\n" for i in range(30)) + "\x1b[31mloss is nan\x1b[0m\n"


@pytest.fixture
def mail():
    with MailSink() as sink:
        yield sink


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "iadeep.db")
    yield s
    s.close()


def _settings(mail=None, hook=None, **extra) -> NotifySettings:
    smtp = None if mail is None else ("127.0.0.1", mail.port)
    return NotifySettings(smtp=smtp, address="{user}@lab.example.org" if smtp else None,
                          webhook=None if hook is None else hook.url, **extra)


def _read_log(job, offset, max_bytes):
    data = LOG.encode()
    return data[offset:offset + max_bytes].decode(), offset + max_bytes, len(data)


def _run_job(store, notify="end", end=S.FAILED, code=3, owner="alice", name="lr3") -> int:
    """A job through queued -> starting -> running -> its end, as the loop records it."""
    with store.tx() as c:
        job_id, _ = jobrows.insert(c, owner, JobSpec(script="/x/train.sh", name=name,
                                                     notify=notify), 100.0)
        jobrows.transition(c, job_id, S.STARTING, "placed", "controller", 101.0, node="n1",
                           gpu_indices=(0,), attempts=1)
        jobrows.transition(c, job_id, S.RUNNING, "running", "controller", 102.0,
                           started_at=102.0, remote_pid=77)
        jobrows.transition(c, job_id, end, f"exited with code {code}", "controller", 200.0,
                           ended_at=200.0, exit_code=code)
    return job_id


def _rows(store, job_id):
    with store.tx() as c:
        return outbox.for_job(c, job_id)


def test_an_ended_job_reaches_the_smtp_server_and_the_webhook(store, mail):
    with HookSink() as hook:
        notifier = Notifier(store, _settings(mail, hook), _read_log)
        job_id = _run_job(store)
        assert notifier.collect() == 2
        assert notifier.deliver("email") == 1 and notifier.deliver("webhook") == 1
        [msg] = mail.received()
        assert msg["To"] == "alice@lab.example.org"
        assert msg["Subject"] == f"[iadeep] job {job_id} (lr3) failed"
        assert msg["Auto-Submitted"] == "auto-generated"
        body = msg.get_content().replace("\r\n", "\n")   # SMTP sends CRLF
        assert f"Job {job_id} (lr3) of alice failed: exited with code 3" in body
        assert "  run time:  0:01:38" in body and "  exit code: 3" in body
        assert "  step 29\n  \\x1b[31mloss is nan\\x1b[0m\n" in body   # the tail, inert
        assert "step 10\n" not in body and "\x1b" not in body         # only the last 20 lines
        _, [posted] = hook.got()
        assert posted["event"] == "end" and posted["job"]["id"] == job_id
        assert posted["job"]["exit_code"] == 3 and posted["job"]["node"] == "n1"
        assert posted["text"].startswith(f"Job {job_id} (lr3) of alice failed")
        assert "log_tail" not in posted and "loss is nan" not in json.dumps(posted)
    assert [r["sent_at"] is not None for r in _rows(store, job_id)] == [True, True]


def test_the_lab_webhook_gets_the_event_never_the_log(store, mail):
    """A job prints a secret; its owner's e-mail carries the log's tail, the lab-wide webhook
    (every member reads its channel) gets the event and nothing of the log."""
    secret = "API_KEY=sk-live-4f9a2"
    logged = LOG + f"{secret}\n"

    def read_log(job, offset, max_bytes):
        data = logged.encode()
        return data[offset:offset + max_bytes].decode(), offset + max_bytes, len(data)

    with HookSink() as hook:
        notifier = Notifier(store, _settings(mail, hook), read_log)
        job_id = _run_job(store)
        assert notifier.collect() == 2
        assert notifier.deliver("email") == 1 and notifier.deliver("webhook") == 1
        [msg] = mail.received()
        assert secret in msg.get_content()
        _, [posted] = hook.got()
        assert posted["job"]["id"] == job_id and posted["job"]["state"] == "failed"
        assert secret not in json.dumps(posted) and "step 29" not in json.dumps(posted)


def test_a_webhook_that_redirects_is_not_followed(store):
    """The webhook answers 302 to another address: nothing reaches that address, and the try
    is a failure that says why (retried, then given up, as any other failure)."""
    with HookSink() as elsewhere, HookSink(redirect_to=elsewhere.url + "?stolen") as hook:
        notifier = Notifier(store, _settings(None, hook), _read_log, backoff_s=(0.0,))
        job_id = _run_job(store)
        assert notifier.collect() == 1
        assert notifier.deliver("webhook") == 0
        assert [method for method, _ in hook.visits] == ["POST"]
        assert elsewhere.visits == []
        [row] = _rows(store, job_id)
        assert row["sent_at"] is None and "302" in row["error"] and "redirect" in row["error"]


def test_mentions_in_a_job_name_ping_nobody(store):
    """A job named to ping the whole channel on Mattermost, Slack or Discord: the text the chat
    shows holds none of the mention forms; the structured field keeps the name exact."""
    name = "@channel @here <!channel> <!here|x> <@U024BE7LH> @all"
    with HookSink() as hook:
        notifier = Notifier(store, _settings(None, hook), _read_log)
        _run_job(store, name=name)
        notifier.collect()
        assert notifier.deliver("webhook") == 1
        _, [posted] = hook.got()
    text = posted["text"]
    for mention in ("@channel", "@here", "@all", "<!", "<@"):
        assert mention not in text, (mention, text)
    assert "@\u200bchannel" in text and "&lt;!channel&gt;" in text
    assert posted["job"]["name"] == name


def test_only_the_moments_asked_for_are_sent(store, mail):
    notifier = Notifier(store, _settings(mail), _read_log)
    quiet = _run_job(store, notify="none")
    ok_but_fail_only = _run_job(store, notify="fail", end=S.SUCCEEDED, code=0)
    everything = _run_job(store, notify="all", end=S.SUCCEEDED, code=0)
    assert notifier.collect() == 2     # the start and the end of the last one
    notifier.deliver("email")
    assert [m["Subject"] for m in mail.received()] == [
        f"[iadeep] job {everything} (lr3) running", f"[iadeep] job {everything} (lr3) succeeded"]
    assert _rows(store, quiet) == _rows(store, ok_but_fail_only) == []


def test_nothing_is_queued_twice_or_lost_across_a_restart(tmp_path, mail):
    """The outbox and its cursor are in the database: a new controller on the same state
    directory sends what was owed and not sent, and nothing that was."""
    with HookSink(fail_first=1) as hook:
        first = Store(tmp_path / "iadeep.db")
        notifier = Notifier(first, _settings(mail, hook), _read_log)
        sent = _run_job(first)
        assert notifier.collect() == 2 and notifier.collect() == 0
        notifier.deliver("email")
        assert notifier.deliver("webhook") == 0          # answered 500: to be retried
        owed = _run_job(first)                           # ended; not collected yet
        first.close()                                    # the controller stops here

        second = Store(tmp_path / "iadeep.db")
        again = Notifier(second, _settings(mail, hook), _read_log,   # restarted after the
                         clock=lambda: time.time() + 60)                  # retry's wait (10 s)
        assert again.collect() == 2                      # only the job not yet collected
        assert again.deliver("email") == 1 and again.deliver("webhook") == 2
        assert sorted(m["Subject"] for m in mail.received()) == sorted(
            f"[iadeep] job {i} (lr3) failed" for i in (sent, owed))
        requests, accepted = hook.got()
        assert [b["job"]["id"] for b in requests] == [sent, sent, owed]
        assert sorted(b["job"]["id"] for b in accepted) == [sent, owed]
        with second.tx() as c:
            assert outbox.due(c, float("inf"), "webhook") == []
        second.close()


def test_a_channel_that_refuses_is_retried_then_given_up_and_logged(store, mail, caplog):
    dead = NotifySettings(webhook=f"http://127.0.0.1:{free_port()}/hooks/secret-token")
    notifier = Notifier(store, dead, _read_log, backoff_s=(0.0, 0.0))
    job_id = _run_job(store)
    notifier.collect()
    with caplog.at_level(logging.WARNING, logger="iadeep.notify"):
        for _ in range(3):
            assert notifier.deliver("webhook") == 0
        assert notifier.deliver("webhook") == 0          # given up: not tried again
    [row] = _rows(store, job_id)
    assert row["attempts"] == 3 and row["gave_up_at"] is not None and row["sent_at"] is None
    assert "cannot reach the webhook" in row["error"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "try 1 of 3" in warnings[0]
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"gave up notifying alice of job {job_id} failed by webhook after 3 tries" in error
    assert "secret-token" not in "\n".join(r.getMessage() for r in caplog.records)


def test_a_hung_webhook_delays_neither_mail_nor_the_caller(store, mail):
    """On its threads: collect and deliver run there, mail goes on while the webhook hangs,
    and the webhook's message arrives once it answers."""
    with HookSink() as hook:
        hook.hold.clear()                                # the webhook accepts, never answers
        # the webhook's try must outlast the test's waits (a timed-out try would be retried
        # later, and the order checked below would then be the retry's)
        notifier = Notifier(store, _settings(mail, hook), _read_log, every_s=0.05,
                            timeout_s=300)
        notifier.start()
        try:
            first = _run_job(store)
            wait_until(lambda: hook.got()[0], limit=120)   # the webhook is now stuck on it
            second = _run_job(store)
            notifier.wake()
            wait_until(lambda: len(mail.received()) == 2, limit=120)
            assert hook.got()[1] == []
            hook.hold.set()
            wait_until(lambda: len(hook.got()[1]) == 2, limit=120)
            assert [b["job"]["id"] for b in hook.got()[1]] == [first, second]
        finally:
            notifier.close()


def test_a_channel_removed_by_a_reload_gives_up_its_queued_messages(store, mail):
    notifier = Notifier(store, _settings(mail), _read_log)
    job_id = _run_job(store)
    notifier.collect()
    notifier.use(NotifySettings())                       # the lab removed lab.notify
    assert notifier.deliver("email") == 0
    [row] = _rows(store, job_id)
    assert row["gave_up_at"] is not None and "no longer set up" in row["error"]
    assert mail.received() == []


@pytest.mark.parametrize("channel", ["webhook", "email"])
def test_a_server_that_drips_its_answer_is_cut_off_at_the_deadline(store, channel):
    """A webhook or SMTP server that answers one byte every half second (never silent long
    enough for a read to time out, never done) holds the channel only until the send's
    deadline: the try fails saying so and its connection is closed, where a timeout per read
    would wait on it for as long as it drips (ten minutes here)."""
    head = b"HTTP/1.1 200 OK\r\nX-Drip: " if channel == "webhook" else b"220 "
    with DripSink(head) as drip:
        settings = (NotifySettings(webhook=drip.url) if channel == "webhook" else
                    NotifySettings(smtp=("127.0.0.1", drip.port), address="{user}@lab.org"))
        notifier = Notifier(store, settings, _read_log, timeout_s=2, backoff_s=(0.0,))
        job_id = _run_job(store)
        notifier.collect()
        done = threading.Event()
        worker = threading.Thread(target=lambda: (notifier.deliver(channel), done.set()),
                                  daemon=True)
        worker.start()
        wait_until(done.is_set, limit=90)
        [row] = _rows(store, job_id)
        assert row["sent_at"] is None and "within 2 s" in row["error"], row["error"]
        wait_until(lambda: drip.counts() == (1, 1), limit=30)   # it let go of the connection


def test_an_array_of_a_thousand_failing_tasks_sends_one_message_per_channel(store, mail):
    """A 1,000-task array with --notify all whose tasks start and fail over several flushes:
    its owner gets one mail when it starts and one when its last task ends, the lab's webhook
    one post each, naming the counts and the tasks that failed; not 2,000 of each."""
    tasks = 1000
    with store.tx() as c:
        first, _ = jobrows.insert(c, "alice", JobSpec(script="/x/t.sh", name="sweep",
                                                      notify="all", array=f"0-{tasks - 1}"),
                                  100.0)
        ids = [first]
        jobrows.update(c, first, array_id=first, array_index=0)
        for index in range(1, tasks):
            task, _ = jobrows.insert(c, "alice", JobSpec(script="/x/t.sh", name="sweep",
                                                         notify="all"), 100.0)
            jobrows.update(c, task, array_id=first, array_index=index)
            ids.append(task)
    with HookSink() as hook:
        notifier = Notifier(store, _settings(mail, hook), _read_log)
        for chunk in range(0, tasks, 250):              # four rounds, each a flush
            with store.tx() as c:
                for i, job_id in enumerate(ids[chunk:chunk + 250]):
                    jobrows.transition(c, job_id, S.STARTING, "placed", "controller", 101.0,
                                       node="n1", gpu_indices=(0,), attempts=1)
                    jobrows.transition(c, job_id, S.RUNNING, "running", "controller", 102.0,
                                       started_at=102.0, remote_pid=77)
                    end = S.SUCCEEDED if chunk + i < 3 else S.FAILED
                    jobrows.transition(c, job_id, end, "exited", "controller", 200.0,
                                       ended_at=200.0, exit_code=0 if end is S.SUCCEEDED else 1)
            notifier.collect()
            notifier.deliver("email")
            notifier.deliver("webhook")
        assert [m["Subject"] for m in mail.received()] == [
            f"[iadeep] array {first} (sweep) started", f"[iadeep] array {first} (sweep) failed"]
        body = mail.received()[1].get_content()
        assert "997 failed, 3 succeeded" in body and f"  {ids[3]} (index 3): failed" in body
        _, posts = hook.got()
    assert [p["event"] for p in posts] == ["array_start", "array_end"]
    assert posts[1]["array"]["states"] == {"failed": 997, "succeeded": 3}
    assert posts[1]["array"]["tasks"] == tasks

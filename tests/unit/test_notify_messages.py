"""Notification messages: which moments a --notify setting wants, what the message says, and
that a job's log reaches e-mail and chat only as inert text."""
from __future__ import annotations

import dataclasses
import json

import pytest

from iadeep_cli.controller.notify import (
    LINE_MAX,
    build,
    clean,
    kind_of,
    log_tail,
    wanted,
    webhook_body,
)
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.store.outbox import Event


def _job(**fields) -> Job:
    base = Job(id=12, owner="alice", spec=JobSpec(script="/home/alice/train.sh", name="lr3"),
               state=JobState.FAILED, submitted_at=1000.0, started_at=1100.0, ended_at=4823.0,
               node="n1", gpu_indices=(0, 1), exit_code=3, reason="exited with code 3")
    return dataclasses.replace(base, **fields)


@pytest.mark.parametrize("notify, kind, state, expected", [
    ("end", "end", "succeeded", True), ("end", "end", "cancelled", True),
    ("end", "start", "running", False),
    ("fail", "end", "failed", True), ("fail", "end", "cancelled", True),
    ("fail", "end", "succeeded", False), ("fail", "start", "running", False),
    ("all", "start", "running", True), ("all", "end", "succeeded", True),
    ("none", "end", "failed", False), ("none", "start", "running", False),
])
def test_which_moments_each_setting_wants(notify, kind, state, expected):
    assert wanted(notify, kind, state) is expected


@pytest.mark.parametrize("old, new, kind", [
    ("starting", "running", "start"), ("lost", "running", None),   # back from a silent node
    ("running", "succeeded", "end"), ("queued", "cancelled", "end"), ("lost", "failed", "end"),
    ("running", "lost", None), ("lost", "queued", None), (None, "queued", None),
    ("queued", "starting", None),
])
def test_which_events_are_a_start_or_an_end(old, new, kind):
    assert kind_of(Event(1, 1, old, new)) == kind


def test_an_end_message_says_state_run_time_exit_code_node_and_log():
    notice = build(_job(), "end", "failed", "epoch 1\nTraceback\nValueError: nan")
    assert notice.subject == "[iadeep] job 12 (lr3) failed"
    assert notice.headline == "Job 12 (lr3) of alice failed: exited with code 3"
    assert notice.summary == "node n1 (GPUs 0,1) | run time 1:02:03 | exit code 3"
    text = notice.text
    for line in ("  state:     failed", "  node:      n1 (GPUs 0,1)", "  run time:  1:02:03",
                 "  exit code: 3", "The last lines of its log (iadeep logs 12):",
                 "  ValueError: nan"):
        assert line in text.split("\n"), line
    job = notice.fields["job"]
    assert notice.fields["event"] == "end" and notice.fields["log_tail"].endswith("nan")
    assert (job["id"], job["owner"], job["state"], job["exit_code"], job["run_time_s"],
            job["node"], job["gpu_indices"]) == (12, "alice", "failed", 3, 3723.0, "n1", [0, 1])


def test_a_start_message_and_a_job_that_never_ran():
    start = build(_job(state=JobState.RUNNING, ended_at=None, exit_code=None, gpu_indices=(2,)),
                  "start", "running", None)
    assert start.headline == "Job 12 (lr3) of alice started on n1 (GPU 2)"
    assert start.summary == "" and "run time" not in start.text and "log" not in start.text
    never = build(_job(node=None, gpu_indices=(), started_at=None, exit_code=None,
                       state=JobState.CANCELLED, reason="cancelled by alice"),
                  "end", "cancelled", None, "it never started")
    assert "run time:  -" in never.text and "(no log: it never started)" in never.text
    assert never.fields["job"]["run_time_s"] is None


def test_a_log_is_cut_to_its_last_lines_each_bounded():
    data = "".join(f"line {i}\n" for i in range(100)) + "x" * 5000 + "\n"
    tail = log_tail(data)
    lines = tail.split("\n")
    assert len(lines) == 20 and lines[0] == "line 81"
    assert lines[-1] == "x" * LINE_MAX + "..."


def test_control_characters_in_a_log_become_visible_text():
    """A job's log may hold terminal escapes (colours, or a title-setting sequence meant for
    whoever reads the mail in a terminal) and carriage-return progress bars."""
    raw = "\x1b[31mred\x1b[0m\n10%\r50%\r100%\nbell\x07 tab\tkept\x00nul\n"
    assert clean(raw) == "\\x1b[31mred\\x1b[0m\n100%\nbell\\x07 tab\tkept\\x00nul\n"
    notice = build(_job(), "end", "failed", log_tail(raw))
    assert "\x1b" not in notice.text and "\x00" not in notice.text and "\x07" not in notice.text


def test_the_webhook_text_is_inert_for_chat_markup_and_carries_no_log():
    """Slack and Mattermost read <...> as links and mentions (<!channel>), Mattermost and
    Discord @channel: a job's name must not be able to ping anyone. The log (its owner's) is
    never in the lab's webhook, in the text or in the fields."""
    log = "<!channel> see <http://evil|here> & ```\nbreak out"
    body = webhook_body(build(_job(spec=JobSpec(script="/x.sh", name="a<b> @here & @all")),
                              "end", "failed", log_tail(log)))
    text = body["text"]
    assert "<" not in text and ">" not in text and "@here" not in text and "@all" not in text
    assert text == ("Job 12 (a&lt;b&gt; @\u200bhere &amp; @\u200ball) of alice failed: exited "
                    "with code 3\nnode n1 (GPUs 0,1) | run time 1:02:03 | exit code 3")
    assert "log_tail" not in body and "evil" not in json.dumps(body)
    assert body["job"]["name"] == "a<b> @here & @all" and body["event"] == "end"
    json.dumps(body)   # all of it is JSON


def test_an_idle_message_says_so_in_its_subject_not_just_running():
    job = _job(state=JobState.RUNNING, ended_at=None, exit_code=None,
               reason="idle: its GPUs sat idle for 1h00m (at or below 5%)")
    notice = build(job, "idle", "running", None)
    assert notice.subject == "[iadeep] job 12 (lr3) holds its GPUs idle"
    assert notice.headline.startswith("Job 12 (lr3) of alice is idle: its GPUs sat idle")

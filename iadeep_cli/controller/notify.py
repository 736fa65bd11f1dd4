"""Telling job owners that their job started or ended: e-mail and a webhook (``--notify``).

Where the notifications come from: the events table, which records every state change of every
job whoever made it (the loop, a user's cancel, an admin's fence). ``Notifier.collect`` reads
the events past a cursor and writes what is owed into the outbox (``store/outbox.py``) in the
same transaction that moves the cursor, so a controller killed at any moment neither forgets a
notification nor queues one twice.

An array's tasks send nothing of their own: its first start and its end (no task of it left
unfinished) are one message each for the whole array (``build_array``), as Slurm does.

The lab's admins are told the same way about a GPU process iadeep did not start that holds a
GPU idle (``steps/foreign.py`` queues it in the same outbox, ``outbox.enqueue_spell``): one
delivery loop (``Notifier.deliver``) sends both kinds.

How they are sent: one thread per channel, never the scheduling loop's. A send that fails (the
SMTP server refuses, the webhook answers 500 or does not answer within SEND_TIMEOUT_S) is
logged and tried again after RETRY_BACKOFF_S, then given up, logged as an error. SEND_TIMEOUT_S
bounds the whole send, not each read (``deadline.py``): a server that answers one byte a second
is cut off at it. A hung webhook therefore delays only the webhook's later messages, by at most
SEND_TIMEOUT_S each, and scheduling not at all.

The guarantee: every notification is sent at least once unless its channel fails every try;
a controller killed after a channel accepted a message but before that was recorded sends it
once more when it starts again (at least once, never lost).
"""
from __future__ import annotations

import json
import logging
import smtplib
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from ..errors import IadeepError, StoreError
from ..jobs import FINISHED, Job, JobState
from ..settings import NotifySettings
from ..store import Store, foreign, jobrows, outbox
from ..text import clock as when, foreign_idle_line, gib, hms
from .deadline import (
    SMTP as deadline_smtp,
    SMTP_SSL as deadline_smtp_ssl,
    Deadline,
    DeadlineExceeded,
    post_json,
)

log = logging.getLogger("iadeep.notify")
CHANNELS = ("email", "webhook")
RETRY_BACKOFF_S = (10.0, 60.0, 300.0, 1800.0)   # waits between tries; then given up
SEND_TIMEOUT_S = 15.0    # a send (all of it) that takes longer has failed this try
LOG_TAIL_LINES = 20      # the last lines of the job's log in an end message
LOG_TAIL_BYTES = 8192    # read at most this much of the log's end (a job's log can be huge)
LINE_MAX = 300           # characters per log line shown (a progress bar may never end one)

LogReader = Callable[[Job, int, int], tuple[str, int, int | None]]


# ---------------------------------------------------------------------------- what is owed
def wanted(notify: str, kind: str, state: str) -> bool:
    """Whether a job with ``--notify notify`` gets a message for this moment."""
    if kind == "idle":
        return True      # an idle job holds GPUs others wait for: told whatever --notify says
    if kind == "start":
        return notify == "all"
    if notify in ("end", "all"):
        return True
    return notify == "fail" and state != JobState.SUCCEEDED.value


def kind_of(event: outbox.Event) -> str | None:
    """'start' for an attempt that began running, 'end' for a final state, else None.
    A lost job seen running again is not a start; a lost job is reported when it ends."""
    if event.new_state in {s.value for s in FINISHED}:
        return "end"
    if event.old_state == JobState.STARTING.value and event.new_state == JobState.RUNNING.value:
        return "start"
    if event.kind == jobrows.IDLE:
        return "idle"     # controller/round/steps/idle.py: its GPUs sat idle
    return None


# ---------------------------------------------------------------------------- the message
@dataclass(frozen=True)
class Notice:
    """One message, in the forms the channels need."""

    subject: str
    headline: str             # one line: which job, whose, what happened
    summary: str              # one line: where, how long, exit code (an end only)
    text: str                 # plain text: the e-mail body
    fields: dict[str, Any] = field(default_factory=dict)   # structured, for the webhook


def clean(text: str) -> str:
    """Text from a job (its log, its name) made safe to show: control characters, escape
    sequences included, are written as ``\\x1b``; carriage returns, which a progress bar uses to
    redraw a line, keep only what was drawn last."""
    out = []
    for line in text.split("\n"):
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
        out.append("".join(c if c.isprintable() or c == "\t" else
                           c.encode("unicode_escape").decode("ascii") for c in line))
    return "\n".join(out)


def log_tail(data: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``data`` (which may start mid-line), each cut to LINE_MAX."""
    kept = data.rstrip("\n").split("\n")[-lines:]
    return "\n".join(line if len(line) <= LINE_MAX else line[:LINE_MAX] + "..."
                     for line in clean("\n".join(kept)).split("\n"))


def build(job: Job, kind: str, state: str, tail: str | None, tail_note: str = "") -> Notice:
    """The message for ``job``'s start or end (``state``: the state its event moved it to).
    ``tail``: the end of its log, None when not read (``tail_note`` then says why)."""
    name = clean(job.name)[:100]
    where = (f"{job.node} (GPU{'s' if len(job.gpu_indices) != 1 else ''} "
             f"{','.join(map(str, job.gpu_indices))})" if job.node and job.gpu_indices
             else job.node or "-")
    run_s = (job.ended_at - job.started_at if kind == "end" and job.started_at is not None
             and job.ended_at is not None else None)
    if kind == "start":
        headline = f"job {job.id} ({name}) of {job.owner} started on {where}"
    elif kind == "idle":
        headline = f"job {job.id} ({name}) of {job.owner} is {clean(job.reason)}"
    else:
        headline = f"job {job.id} ({name}) of {job.owner} {state}: {clean(job.reason)}"
    rows = [("state", state), ("reason", clean(job.reason)), ("node", where),
            ("submitted", when(job.submitted_at)), ("started", when(job.started_at))]
    if kind == "end":
        rows += [("ended", when(job.ended_at)), ("run time", hms(run_s)),
                 ("exit code", "-" if job.exit_code is None else str(job.exit_code))]
    headline = headline[:1].upper() + headline[1:]
    summary = (f"node {where} | run time {hms(run_s)} | exit code "
               f"{'-' if job.exit_code is None else job.exit_code}" if kind == "end" else "")
    body = [headline, ""]
    body += [f"  {label + ':':<11}{value}" for label, value in rows]
    if kind == "end":
        body.append("")
        if tail is None:
            body.append(f"(no log: {tail_note or 'not read'})")
        elif not tail:
            body.append("(its log is empty)")
        else:
            body.append(f"The last lines of its log (iadeep logs {job.id}):")
            body += [f"  {line}" for line in tail.split("\n")]
    fields = {
        "event": kind,
        "job": {"id": job.id, "name": job.name, "owner": job.owner, "state": state,
                "reason": job.reason, "node": job.node, "gpu_indices": list(job.gpu_indices),
                "exit_code": job.exit_code, "run_time_s": run_s,
                "submitted_at": job.submitted_at, "started_at": job.started_at,
                "ended_at": job.ended_at, "attempts": job.attempts},
        "log_tail": tail,
    }
    # an idle job is still running: its subject says what the message is about
    what = "holds its GPUs idle" if kind == "idle" else state
    return Notice(subject=f"[iadeep] job {job.id} ({name}) {what}"[:200], headline=headline,
                  summary=summary, text="\n".join(body) + "\n", fields=fields)


def webhook_body(notice: Notice) -> dict[str, Any]:
    """The JSON a webhook gets: ``text`` (what Slack and Mattermost incoming webhooks show: the
    headline and the details, their markup inert) and the structured fields. Never the job's
    log: the webhook is the lab's channel, and a log is its owner's and the admins' (e-mail,
    which goes to the owner, carries its tail). Mentions cannot ping anyone: ``<`` is escaped
    (Slack's ``<!channel>``, ``<@U123>``) and every ``@`` is followed by a zero-width space
    (Mattermost's and Discord's ``@channel``, ``@here``, ``@all``, ``@user``)."""
    def esc(s: str) -> str:
        return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                .replace("@", "@\u200b"))

    text = esc(notice.headline)
    if notice.summary:
        text += "\n" + esc(notice.summary)
    return {"text": text, **{k: v for k, v in notice.fields.items() if k != "log_tail"}}


# ---------------------------------------------------------------------------- arrays
# One message per array, not per task (as Slurm mails an array once): a 1,000-task array that
# fails would otherwise send its owner 1,000 mails and the lab's webhook 1,000 posts. An array's
# tasks queue nothing of their own: the first task that starts queues the array's start
# (``--notify all``), and the task whose end leaves none of the array unfinished queues the
# array's end, which counts its tasks by state and names the ones that did not succeed.
FINISHED_VALUES = frozenset(s.value for s in FINISHED)
NAMED_TASKS = 20   # an end message names at most this many tasks that did not succeed


def ended(counts: dict[str, int]) -> bool:
    """Whether every task of an array (its state -> how many) is in a final state."""
    return bool(counts) and all(state in FINISHED_VALUES for state in counts)


def array_state(counts: dict[str, int]) -> str:
    """The array's one state: its tasks' when they all share one, else the worst of them
    (failed, then timeout, then cancelled): 'succeeded' only when every task succeeded."""
    if len(counts) == 1:
        return next(iter(counts))
    for state in (JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED):
        if counts.get(state.value):
            return state.value
    return JobState.FAILED.value


def build_array(tasks: list[Job], kind: str, state: str) -> Notice:
    """The message for an array (``tasks``: all of them, its first task first)."""
    first = tasks[0]
    name = clean(first.name)[:100]
    array_id = first.array_id if first.array_id is not None else first.id
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task.state.value] = counts.get(task.state.value, 0) + 1
    tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    unsuccessful = [t for t in tasks if t.state is not JobState.SUCCEEDED]
    if kind == "array_start":
        headline = (f"Array {array_id} ({name}) of {first.owner} started: {len(tasks)} tasks "
                    f"(its first on {first.node or '-'})")
        summary = ""
    else:
        headline = f"Array {array_id} ({name}) of {first.owner} {state}: {tally}"
        summary = f"{len(tasks)} tasks | {tally}"
    body = [headline, "", f"  {'submitted:':<11}{when(first.submitted_at)}",
            f"  {'tasks:':<11}{len(tasks)}"]
    if kind == "array_end":
        body.append(f"  {'states:':<11}{tally}")
        if unsuccessful:
            body += ["", "Tasks that did not succeed (iadeep logs ID reads one's log):"]
            body += [f"  {t.id} (index {t.array_index}): {t.state.value}: {clean(t.reason)}"
                     for t in unsuccessful[:NAMED_TASKS]]
            if len(unsuccessful) > NAMED_TASKS:
                body.append(f"  ... and {len(unsuccessful) - NAMED_TASKS} more "
                            f"(iadeep queue list --all)")
    fields = {
        "event": kind,
        "array": {"id": array_id, "name": first.name, "owner": first.owner, "state": state,
                  "tasks": len(tasks), "states": counts,
                  "unsuccessful": [{"id": t.id, "index": t.array_index, "state": t.state.value,
                                    "exit_code": t.exit_code}
                                   for t in unsuccessful[:NAMED_TASKS]]},
    }
    subject = (f"[iadeep] array {array_id} ({name}) "
               f"{'started' if kind == 'array_start' else state}")
    return Notice(subject=subject[:200], headline=headline, summary=summary,
                  text="\n".join(body) + "\n", fields=fields)


# ---------------------------------------------------------------------------- the channels
def send_email(settings: NotifySettings, to: str, notice: Notice,
               timeout: float = SEND_TIMEOUT_S) -> None:
    """Through the lab's SMTP relay: plain (a lab relay that takes mail from its hosts), or
    over TLS (``starttls`` or implicit ``tls``, the server's certificate verified against the
    system's CAs or ``smtp_ca_file``) with a login from ``smtp_login_file`` (read at each send,
    so it can be rotated in place). Raises OSError or smtplib.SMTPException when the server
    does not take it, and DeadlineExceeded when it has not within ``timeout`` seconds in all
    (however it answers)."""
    assert settings.smtp is not None   # only queued when e-mail is set up
    msg = EmailMessage()
    msg["Subject"] = notice.subject
    msg["From"] = settings.sender or f"iadeep@{socket.getfqdn()}"
    msg["To"] = to
    msg["Auto-Submitted"] = "auto-generated"   # RFC 3834: no vacation replies to this
    msg.set_content(notice.text)
    host, port = settings.smtp
    login = None if settings.smtp_login_file is None else _login(settings.smtp_login_file)
    context = None
    if settings.smtp_tls != "none":
        context = ssl.create_default_context(cafile=settings.smtp_ca_file)
    with Deadline(timeout) as deadline:
        try:
            opened = deadline_smtp_ssl(host, port, deadline, context) \
                if settings.smtp_tls == "tls" and context is not None else \
                deadline_smtp(host, port, deadline)
            with opened as smtp:
                if settings.smtp_tls == "starttls":
                    smtp.ehlo()
                    if not smtp.has_extn("starttls"):   # never fall back to plain text
                        raise smtplib.SMTPNotSupportedError(
                            f"{host}:{port} offers no STARTTLS (lab.notify.tls: starttls)")
                    smtp.starttls(context=context)
                if login is not None:
                    _log_in(smtp, *login)
                smtp.send_message(msg)
        except (OSError, smtplib.SMTPException):
            deadline.check()   # cut off at the deadline: say so
            raise


def _log_in(smtp: smtplib.SMTP, user: str, password: str) -> None:
    """AUTH PLAIN where offered (one attempt: smtplib's login() would try every mechanism in
    turn, and relays count failed attempts towards locking the account), else login()."""
    smtp.ehlo_or_helo_if_needed()
    if "plain" in smtp.esmtp_features.get("auth", "").lower().split():
        smtp.user, smtp.password = user, password
        smtp.auth("PLAIN", smtp.auth_plain)
    else:
        smtp.login(user, password)


def _login(path: str) -> tuple[str, str]:
    """(user, password) from the login file: ``USER`` and ``PASSWORD`` on two lines, or
    ``USER:PASSWORD`` on one. Raises OSError naming the file when it cannot be used."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise OSError(f"cannot read the SMTP login file {path}: {exc.strerror}") from None
    if len(lines) >= 2 and lines[0].strip():
        return lines[0].strip(), lines[1].rstrip("\n")
    if lines and ":" in lines[0]:
        user, _, password = lines[0].partition(":")
        return user.strip(), password
    raise OSError(f"the SMTP login file {path} holds no USER and PASSWORD (two lines, or "
                  "USER:PASSWORD)")


def webhook_format(settings: NotifySettings) -> str:
    """The message form the lab's webhook takes: as set, or told by its URL's host."""
    if settings.webhook_format != "auto" or settings.webhook is None:
        return settings.webhook_format
    parts = urllib.parse.urlsplit(settings.webhook)
    host, path = (parts.hostname or "").lower(), parts.path
    if host in ("discord.com", "discordapp.com", "ptb.discord.com") and "/webhooks/" in path:
        return "discord"
    if host.endswith((".webhook.office.com", ".logic.azure.com", ".powerplatform.com")):
        return "teams"
    if host == "ntfy.sh" or host.startswith("ntfy."):
        return "ntfy"
    return "slack"   # Slack's {"text": ...}, which Mattermost, Rocket.Chat and most take


def webhook_request(notice: Notice, form: str) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one webhook POST in the service's own form (``form``): the
    text of ``webhook_body`` (mentions made inert), as each service shows a message."""
    body = webhook_body(notice)
    text = body["text"]
    json_type = {"Content-Type": "application/json"}
    if form in ("slack", "mattermost"):
        return json.dumps(body).encode(), json_type
    if form == "discord":   # content up to 2,000 characters; no mention may ping
        return json.dumps({"content": text[:2000],
                           "allowed_mentions": {"parse": []}}).encode(), json_type
    if form == "teams":     # an Adaptive Card, as Teams' workflow webhooks take it
        card = {"type": "AdaptiveCard", "version": "1.4",
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "body": [{"type": "TextBlock", "text": line, "wrap": True}
                         for line in text.split("\n")]}
        return json.dumps({"type": "message", "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive", "content": card}]}
        ).encode(), json_type
    if form == "ntfy":      # plain text, the subject as its title
        return text.encode(), {"Content-Type": "text/plain; charset=utf-8",
                               "Title": notice.subject.encode("ascii", "replace").decode(),
                               "Tags": "iadeep"}
    return json.dumps({k: v for k, v in body.items() if k != "text"}).encode(), json_type


def send_webhook(url: str, notice: Notice, timeout: float = SEND_TIMEOUT_S,
                 form: str = "slack") -> None:
    """A POST in the service's form (``webhook_request``); any answer but 2xx is a failure
    (raises OSError), a redirect included (never followed: the webhook's URL is the admin's
    choice, and whoever answers there must not send the controller's requests anywhere else).
    The whole send, the answer's last byte included, ends within ``timeout`` seconds
    (DeadlineExceeded)."""
    data, headers = webhook_request(notice, form)
    with Deadline(timeout) as deadline:
        try:
            status, reason = post_json(url, data, deadline,
                                       {**headers, "User-Agent": "iadeep-notify"})
        except DeadlineExceeded:
            raise
        except OSError as exc:
            raise OSError(f"cannot reach the webhook: {exc.strerror or exc}") from exc
    if 300 <= status < 400:
        raise OSError(f"HTTP {status} {reason}: a redirect (not followed)")
    if not 200 <= status < 300:
        raise OSError(f"HTTP {status} {reason}")


def _url_for_log(url: str) -> str:
    """A webhook URL without its path and query: those often hold the secret (Slack's do)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/..."


# ---------------------------------------------------------------------------- the notifier
class Notifier:
    """Collects owed notifications from the events and sends them, off the scheduling loop."""

    def __init__(self, store: Store, settings: NotifySettings, log_reader: LogReader | None = None,
                 clock: Callable[[], float] = time.time, every_s: float = 10.0,
                 backoff_s: tuple[float, ...] = RETRY_BACKOFF_S,
                 timeout_s: float = SEND_TIMEOUT_S):
        self.store, self.settings, self.log_reader = store, settings, log_reader
        self.clock, self.every_s = clock, every_s
        self.backoff_s, self.timeout_s = backoff_s, timeout_s
        self._stop = threading.Event()
        self._wakes = {channel: threading.Event() for channel in CHANNELS}
        self._threads: list[threading.Thread] = []
        self._failing: dict[str, str] = {}   # channel -> last error, to log a change once

    # -------------------------------------------------------------- life
    def start(self) -> None:
        for channel in CHANNELS:
            thread = threading.Thread(target=self._run, args=(channel,), daemon=True,
                                      name=f"iadeep-notify-{channel}")
            thread.start()
            self._threads.append(thread)

    def wake(self) -> None:
        """Look for new events now (the runtime calls this after each round)."""
        for event in self._wakes.values():
            event.set()

    def use(self, settings: NotifySettings) -> None:
        """A reloaded inventory's channels, from the next message on."""
        self.settings = settings

    def close(self, wait_s: float = 2.0) -> None:
        """Stop the threads; a send in progress is not waited for beyond ``wait_s`` (it is
        sent again at the next start, as it was not recorded sent)."""
        self._stop.set()
        self.wake()
        deadline = time.monotonic() + wait_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, channel: str) -> None:
        wake = self._wakes[channel]
        while not self._stop.is_set():
            try:
                self.collect()
                self.deliver(channel)   # the owners' and the admins' messages (one outbox)
                with self.store.tx() as conn:
                    due = outbox.next_due(conn, channel)
            except StoreError as exc:   # the runtime reports a sick state directory
                log.debug("notifications wait: %s", exc.message)
                due = None
            except Exception:
                if self._stop.is_set():   # a send outlived close(): the store is gone; it is
                    return                # sent again at the next start (not recorded sent)
                log.exception("notifications (%s): unexpected error; trying again later",
                              channel)
                due = None
            wait = self.every_s if due is None else min(self.every_s, due - self.clock())
            wake.wait(max(0.01, wait))
            wake.clear()

    # -------------------------------------------------------------- collect
    def collect(self) -> int:
        """Queue what the events since the last call owe; returns how many were queued."""
        queued = 0
        arrays_seen: set[tuple[int, str]] = set()
        with self.store.tx() as conn:
            events = outbox.events_after(conn)
            for event in events:
                kind = kind_of(event)
                if kind is None:
                    continue
                job = jobrows.get(conn, event.job_id)
                # one message per array, not per task (a task run again is its own job)
                if job.array_id is not None and job.rerun_of is None:
                    if (job.array_id, kind) not in arrays_seen:
                        arrays_seen.add((job.array_id, kind))
                        queued += self._collect_array(conn, event, kind, job)
                    continue
                if not wanted(job.spec.notify, kind, event.new_state):
                    continue
                for channel in self._channels_for(job.owner):
                    outbox.enqueue(conn, event, kind, channel, self.clock())
                    queued += 1
            if events:
                outbox.advance(conn, events[-1].id)
        if queued:
            self.wake()
        return queued

    def _collect_array(self, conn, event: outbox.Event, kind: str, task: Job) -> int:
        """Queue the array's start at its first task's start, its end once no task of it is
        unfinished; each once (whichever task's event comes first)."""
        assert task.array_id is not None
        state = event.new_state
        if kind == "end":
            counts = outbox.array_counts(conn, task.array_id)
            if not ended(counts):
                return 0
            state = array_state(counts)
        if not wanted(task.spec.notify, kind, state):
            return 0
        queued = 0
        for channel in self._channels_for(task.owner):
            if not outbox.queued(conn, task.array_id, f"array_{kind}", channel):
                outbox.enqueue(conn, event, f"array_{kind}", channel, self.clock(),
                               job_id=task.array_id, state=state)
                queued += 1
        return queued

    def _channels_for(self, user: str) -> list[str]:
        out = []
        if self.settings.email_for(user) is not None:
            out.append("email")
        if self.settings.webhook is not None:
            out.append("webhook")
        return out

    # -------------------------------------------------------------- deliver
    def deliver(self, channel: str) -> int:
        """The one delivery loop: every due message of ``channel`` (a job's notification or
        the admins' message about a foreign idle spell) sent once, marked sent, or retried
        after ``backoff_s`` and given up past it or when its channel is gone
        (``_Unsendable``). How many were sent."""
        with self.store.tx() as conn:
            due = outbox.due(conn, self.clock(), channel)
        sent = 0
        for note in due:
            if self._stop.is_set():
                break
            send, failed = self._spell_message(note) if note.foreign_id is not None \
                else self._job_message(note)
            try:
                said = send()
            except Exception as exc:   # every way a channel can fail: retried, then given up
                error = _describe(exc)
                if channel == "webhook" and self.settings.webhook:
                    error = f"{error} ({_url_for_log(self.settings.webhook)})"
                tries = note.attempts + 1
                give_up = isinstance(exc, _Unsendable) or tries > len(self.backoff_s)
                retry_at = None if give_up else self.clock() + self.backoff_s[tries - 1]
                with self.store.tx() as conn:
                    outbox.mark_failed(conn, note.id, self.clock(), error, retry_at)
                failed(error, tries, give_up)
                if not give_up:
                    self._failing[channel] = error
                continue
            with self.store.tx() as conn:
                outbox.mark_sent(conn, note.id, self.clock())
            sent += 1
            log.info("%s", said)
            if self._failing.pop(channel, None) is not None:
                log.info("notifications by %s get through again", channel)
        return sent

    def _job_message(self, note: outbox.Pending) -> tuple[Callable[[], str], _Failed]:
        """A job's notification: its send (which returns the line logged once it went) and
        what logs its failure."""
        assert note.job_id is not None
        with self.store.tx() as conn:
            job = jobrows.get(conn, note.job_id)
        return (lambda: self._send(note, job),
                lambda error, tries, give_up: self._failed(note, job, error, tries, give_up))

    def _send(self, note: outbox.Pending, job: Job) -> str:
        # the log's tail goes by e-mail to its owner only, never to the lab's webhook
        if note.kind.startswith("array_"):
            with self.store.tx() as conn:
                tasks = jobrows.array_tasks(conn, job.id)
            notice = build_array(tasks or [job], note.kind, note.state)
        else:
            tail, why = self._tail(job) if note.kind == "end" and note.channel == "email" \
                else (None, "")
            notice = build(job, note.kind, note.state, tail, why)
        self._post(note.channel, job.owner, "user", notice)
        return (f"notified {job.owner} of {'array' if note.kind.startswith('array_') else 'job'}"
                f" {job.id} {'start' if note.kind.endswith('start') else note.state} "
                f"({note.channel})")

    def _post(self, channel: str, user: str, who: str, notice: Notice) -> None:
        """Send ``notice`` by ``channel``: to the e-mail address of ``user`` (a ``who``: user
        or admin), or to the lab's webhook; ``_Unsendable`` when that channel is gone."""
        if channel == "email":
            to = self.settings.email_for(user)
            if to is None:
                raise _Unsendable(f"e-mail is no longer set up for this {who}")
            send_email(self.settings, to, notice, self.timeout_s)
        else:
            if self.settings.webhook is None:
                raise _Unsendable("no webhook is set up any more")
            send_webhook(self.settings.webhook, notice, self.timeout_s,
                         webhook_format(self.settings))

    def _failed(self, note: outbox.Pending, job: Job, error: str, tries: int,
                give_up: bool) -> None:
        if give_up:
            log.error("gave up notifying %s of job %d %s by %s after %d tries: %s", job.owner,
                      job.id, note.state, note.channel, tries, error)
        else:
            log.warning("notifying %s of job %d by %s failed (try %d of %d), next try in "
                        "%.0f s: %s", job.owner, job.id, note.channel, tries,
                        len(self.backoff_s) + 1, self.backoff_s[tries - 1], error)

    def _tail(self, job: Job) -> tuple[str | None, str]:
        """The end of the job's log, through the node (bounded: LOG_TAIL_BYTES), or None and
        why not. A job that never reached a node has no log."""
        if job.node is None:
            return None, "it never started"
        if self.log_reader is None:
            return None, "this controller has no node connections"
        try:
            _, _, size = self.log_reader(job, 0, 1)
            start = max(0, (size or 0) - LOG_TAIL_BYTES)
            data, _, _ = self.log_reader(job, start, LOG_TAIL_BYTES)
        except IadeepError as exc:
            return None, exc.message
        except OSError as exc:
            return None, str(exc)
        if start > 0:   # the first line read is probably a part of one
            data = data.split("\n", 1)[1] if "\n" in data else ""
        return log_tail(data), ""


    # -------------------------------------------------------------- foreign idle GPU holders
    def _spell_message(self, note: outbox.Pending) -> tuple[Callable[[], str], _Failed]:
        """The admins' message about a process iadeep did not start holding a GPU idle
        (round/steps/foreign.py): its send and what logs its failure."""
        assert note.foreign_id is not None
        channel = note.channel
        with self.store.tx() as conn:
            spell = foreign.get(conn, note.foreign_id)

        def send() -> str:
            self._post(channel, note.recipient, "admin", build_foreign(spell))
            return (f"notified the admins of foreign pid {spell.pid} on "
                    f"{spell.node}:{spell.gpu} ({channel})")

        def failed(error: str, tries: int, give_up: bool) -> None:
            (log.error if give_up else log.warning)(
                "notifying the admins of foreign pid %d by %s failed (try %d)%s: %s",
                spell.pid, channel, tries, "; given up" if give_up else "", error)
        return send, failed


def build_foreign(spell: foreign.Spell) -> Notice:
    """The admins' message about a process iadeep did not start holding a GPU idle."""
    idle_s = spell.marked_at - spell.since
    headline = "GPU " + foreign_idle_line(spell.node, spell.gpu, spell.pid, spell.name,
                                          spell.mib, idle_s) + " (iadeep does not stop it)"
    body = [headline, "",
            f"  {'node:':<11}{spell.node}", f"  {'GPU:':<11}{spell.gpu}",
            f"  {'pid:':<11}{spell.pid}", f"  {'process:':<11}{clean(spell.name) or '-'}",
            f"  {'memory:':<11}{gib(spell.mib, unit=' GiB')}",
            f"  {'idle since:':<11}{when(spell.since)}", "",
            "It is no iadeep job: see whose it is on the node (ps -o user= -p PID)."]
    fields = {"event": "foreign_idle",
              "gpu": {"node": spell.node, "index": spell.gpu, "pid": spell.pid,
                      "process": spell.name, "memory_mib": spell.mib,
                      "idle_since": spell.since, "idle_s": round(idle_s, 3)}}
    return Notice(subject=f"[iadeep] GPU {spell.node}:{spell.gpu} held idle by pid "
                          f"{spell.pid}"[:200],
                  headline=headline, summary="", text="\n".join(body) + "\n", fields=fields)


# What logs a failed try: (the error, which try it was, given up?)
_Failed = Callable[[str, int, bool], None]


class _Unsendable(Exception):
    """A channel that was removed from the inventory since the message was queued."""


def _describe(exc: Exception) -> str:
    if isinstance(exc, smtplib.SMTPResponseException):
        said = exc.smtp_error
        text = said.decode(errors="replace") if isinstance(said, bytes) else said
        return f"SMTP {exc.smtp_code} {text}"
    return str(exc) or type(exc).__name__

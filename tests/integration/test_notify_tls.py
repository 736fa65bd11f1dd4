"""Mail that reaches people: the notifier's e-mail through real TLS SMTP servers (aiosmtpd with
STARTTLS, or implicit TLS as on port 465) that require a login, as university relays do; and
its webhook in each chat service's own form, posted to a real HTTP server. The certificate is
made here by a CA of the test's own, which the client is told to trust (`ca_file`)."""
from __future__ import annotations

import os
import smtplib
import ssl

import pytest

from helpers.sinks import HookSink, MailSink, tls_files
from iadeep_cli.controller.notify import (
    Notice,
    send_email,
    send_webhook,
    webhook_format,
)
from iadeep_cli.errors import ConfigError
from iadeep_cli.inventory import NotifySettings, parse_inventory

LOGIN = ("iadeep-relay", "s3cret pass:word")
NOTICE = Notice(subject="[iadeep] job 12 (lr3) failed", headline="Job 12 (lr3) of alice "
                "failed: exited with code 3 <!channel> @here", summary="node n1 | exit code 3",
                text="Job 12 failed\n", fields={"event": "end", "job": {"id": 12}})


@pytest.fixture
def certs(tmp_path):
    return tls_files(tmp_path)


def _login_file(tmp_path, mode: int = 0o600) -> str:
    path = tmp_path / "smtp-login"
    path.write_text(f"{LOGIN[0]}\n{LOGIN[1]}\n")
    path.chmod(mode)
    return str(path)


def _settings(sink: MailSink, tls: str, ca: str | None, login: str | None) -> NotifySettings:
    return NotifySettings(smtp=("127.0.0.1", sink.port), smtp_tls=tls, smtp_ca_file=ca,
                          smtp_login_file=login, address="{user}@lab.example.org")


# aiosmtpd warns about AUTH without STARTTLS: on the implicit-TLS sink every session is TLS
@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
@pytest.mark.parametrize("tls", ["starttls", "tls"])
def test_mail_goes_through_a_tls_relay_that_requires_a_login(tmp_path, certs, tls):
    ca, cert, key = certs
    with MailSink(tls=tls, cert=(cert, key), login=LOGIN) as sink:
        send_email(_settings(sink, tls, ca, _login_file(tmp_path)), "alice@lab.example.org",
                   NOTICE, timeout=30)
        [got] = sink.received()
        assert got["Subject"] == NOTICE.subject and got["To"] == "alice@lab.example.org"
        assert sink.logins == [(LOGIN[0], True)]


def test_a_wrong_password_is_refused_and_nothing_is_sent(tmp_path, certs):
    ca, cert, key = certs
    login = tmp_path / "bad"
    login.write_text(f"{LOGIN[0]}:wrong\n")
    login.chmod(0o600)
    with MailSink(tls="starttls", cert=(cert, key), login=LOGIN) as sink:
        with pytest.raises(smtplib.SMTPAuthenticationError):
            send_email(_settings(sink, "starttls", ca, str(login)), "a@x.org", NOTICE, 30)
        assert sink.received() == [] and sink.logins == [(LOGIN[0], False)]


def test_a_relay_whose_certificate_is_not_trusted_never_sees_the_password(tmp_path, certs):
    _, cert, key = certs
    with MailSink(tls="starttls", cert=(cert, key), login=LOGIN) as sink:
        with pytest.raises(ssl.SSLCertVerificationError):   # the system's CAs: not ours
            send_email(_settings(sink, "starttls", None, _login_file(tmp_path)), "a@x.org",
                       NOTICE, 30)
        assert sink.received() == [] and sink.logins == []


def test_starttls_asked_of_a_relay_without_it_never_falls_back_to_plain_text(certs):
    ca, _, _ = certs
    with MailSink() as sink:   # plain SMTP, no STARTTLS offered
        with pytest.raises(smtplib.SMTPNotSupportedError, match="offers no STARTTLS"):
            send_email(_settings(sink, "starttls", ca, None), "a@x.org", NOTICE, 30)
        assert sink.received() == []


def _inventory(notify: str) -> str:
    return f"lab:\n  notify:\n{notify}nodes: []\n"


def test_the_inventory_refuses_a_login_file_others_can_read_or_a_login_in_clear(tmp_path):
    smtp = "    smtp: relay.uni.example:587\n    address: '{user}@uni.example'\n"
    loose = _login_file(tmp_path, 0o644)
    with pytest.raises(ConfigError, match=r"open to other accounts \(mode 644\).*chmod 600"):
        parse_inventory(_inventory(smtp + f"    tls: starttls\n    login_file: {loose}\n"),
                        tmp_path / "nodes.yaml")
    os.chmod(loose, 0o600)
    with pytest.raises(ConfigError, match="a login needs tls: starttls or tls"):
        parse_inventory(_inventory(smtp + f"    login_file: {loose}\n"), tmp_path / "nodes.yaml")
    inv = parse_inventory(_inventory(smtp + f"    tls: starttls\n    login_file: {loose}\n"),
                          tmp_path / "nodes.yaml")
    assert (inv.notify.smtp_tls, inv.notify.smtp_login_file) == ("starttls", loose)


@pytest.mark.parametrize("url, form", [
    ("https://hooks.slack.com/services/T0/B0/X", "slack"),
    ("https://discord.com/api/webhooks/1/abc", "discord"),
    ("https://lab.webhook.office.com/webhookb2/abc", "teams"),
    ("https://ntfy.sh/our-lab-gpus", "ntfy"),
    ("https://chat.lab.example.org/hooks/abc", "slack"),   # Mattermost's: Slack's form
])
def test_the_webhooks_form_is_told_by_its_host(url, form):
    assert webhook_format(NotifySettings(webhook=url)) == form
    assert webhook_format(NotifySettings(webhook=url, webhook_format="json")) == "json"


def test_each_chat_service_gets_the_message_in_its_own_form_with_mentions_inert():
    with HookSink() as hook:
        for form in ("slack", "discord", "teams", "ntfy", "json"):
            send_webhook(hook.url, NOTICE, 30, form=form)
        _, (slack, discord, teams, ntfy, fields) = hook.got()
    assert slack["text"].startswith("Job 12 (lr3) of alice failed") and \
        "&lt;!channel&gt;" in slack["text"] and "@\u200bhere" in slack["text"]
    assert discord["content"] == slack["text"] and discord["allowed_mentions"] == {"parse": []}
    card = teams["attachments"][0]["content"]
    assert teams["type"] == "message" and card["type"] == "AdaptiveCard"
    assert [b["text"] for b in card["body"]] == slack["text"].split("\n")
    assert ntfy["raw"] == slack["text"] and ntfy["headers"]["Title"] == NOTICE.subject
    assert "text" not in fields and fields["job"] == {"id": 12}

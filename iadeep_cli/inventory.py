"""The lab's node inventory (``nodes.yaml``): YAML in, validated immutable objects out.

Validation is strict because a typo in a scheduler's config silently changes placement: unknown
keys, wrong types and duplicate names are refused, and every message names the file, the line and
the field, e.g. ``nodes.yaml:12: nodes[1].port: expected an integer, got 'twenty-two'``.
"""
from __future__ import annotations

import os
import re
import string
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .jobs import NOTIFY_WHEN
from .paths import inventory_path
from .settings import (  # the values parse_inventory makes
    COLD_START_RULES,
    IDLE_ACTIONS,
    PREEMPTION_RULES,
    SHARING_RULES,
    AdaptPolicy,
    FairShare,
    IdleSettings,
    Inventory,
    MetricsSettings,
    Node,
    NotifySettings,
    Policy,
    SlurmSettings,
    UserLimit,
    is_loopback,
    parse_listen,
)


# --------------------------------------------------------------------------- validation helpers
class _Ctx:
    """Carries the file name so every message can say file:line: field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, node: yaml.Node | None, where: str, msg: str) -> ConfigError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return ConfigError(
            f"{self.path}{line}: {where}: {msg}",
            hint="fix the inventory (see nodes.yaml.example for every field)",
        )


def _scalar(ctx: _Ctx, node: yaml.Node, where: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, where, "expected a single value, got a list or mapping")
    try:  # resolve the tag the way safe_load would (`!!int abc` and `!foo 1` fail here)
        return yaml.SafeLoader("").construct_object(node)
    except (yaml.YAMLError, ValueError) as exc:
        raise ctx.fail(node, where, f"cannot read value {node.value!r}: "
                                    f"{getattr(exc, 'problem', None) or exc}") from None


def _typed(kind: type | tuple, label: str) -> Callable[[_Ctx, yaml.Node, str], Any]:
    def conv(ctx: _Ctx, node: yaml.Node, where: str) -> Any:
        value = _scalar(ctx, node, where)
        ok = isinstance(value, kind) and not (isinstance(value, bool)
                                              and bool not in _as_tuple(kind))
        if not ok:
            raise ctx.fail(node, where, f"expected {label}, got {value!r}")
        return float(value) if kind == (int, float) else value
    return conv


def _as_tuple(kind: type | tuple) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


_str = _typed(str, "a string")
_int = _typed(int, "an integer")
_num = _typed((int, float), "a number")
_bool = _typed(bool, "true or false")


def _within(conv, ok: Callable[[Any], object], allowed: str):
    """``conv``, then a range check: a value of the right type can still be meaningless
    (``port: 99999``, ``poll_interval: 0``) and must be refused, saying what is allowed."""
    def check(ctx: _Ctx, node: yaml.Node, where: str) -> Any:
        value = conv(ctx, node, where)
        if not ok(value):
            got = f"{value:g}" if isinstance(value, float) else repr(value)
            raise ctx.fail(node, where, f"expected {allowed}, got {got}")
        return value
    return check


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_word = _within(_str, lambda v: v != "" and not any(c.isspace() for c in v) and v[0] != "-",
                "a non-empty value without spaces, not starting with '-'")
_at_least_0 = _within(_num, lambda v: v >= 0, "a number >= 0")
_count = _within(_int, lambda v: v >= 0, "a whole number >= 0")
_per_gpu = _within(_int, lambda v: v >= 1, "a whole number >= 1")


def _list_of(item_conv, what: str):
    """A YAML list whose items ``item_conv`` checks; the same item twice is refused (a
    repeated GPU index or admin is a typo for another one)."""
    def conv(ctx: _Ctx, node: yaml.Node, where: str) -> tuple:
        if not isinstance(node, yaml.SequenceNode):
            raise ctx.fail(node, where, f"expected a list of {what}")
        items: list = []
        for i, item in enumerate(node.value):
            value = item_conv(ctx, item, f"{where}[{i}]")
            if value in items:
                raise ctx.fail(item, f"{where}[{i}]", f"{value!r} is listed twice")
            items.append(value)
        return tuple(items)
    return conv


_str_list = _list_of(_word, "strings")
# A user or group name a node's shell and sudo will see (Debian's useradd accepts these); root
# is refused by name: iadeep never runs a job as root (docs/security.md).
ACCOUNT_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
_account = _within(_str, lambda v: ACCOUNT_NAME.fullmatch(v) is not None and v != "root",
                   "an account name (lower-case letters, digits, '_', '.', '-'), never root")
_account_list = _list_of(_account, "account names, e.g. [alice, bob]")
_run_as = _within(_str, lambda v: v in ("account", "submitter"), "account or submitter")
RUN_AS_FIELDS = {"run_as": _run_as, "allowed_users": _account_list, "allowed_group": _account}
_shared_paths = _list_of(
    _within(_str, lambda v: v.startswith("/") and "\0" not in v and "\n" not in v,
            "an absolute directory path, e.g. /home"), "absolute paths, e.g. [/home, /data]")
def _host_mem(ctx: _Ctx, node: yaml.Node, where: str) -> int:
    """``host_mem: 512G`` (K, M, G, T; a bare number: MiB, as Slurm's RealMemory) in MiB."""
    text = str(_scalar(ctx, node, where)).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT])?i?B?", text, re.IGNORECASE)
    if m is None or float(m[1]) <= 0:
        raise ctx.fail(node, where, "expected a size, e.g. 512G or 64000M")
    return max(1, round(float(m[1]) * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}[
        (m[2] or "M").upper()]))


_gpu_list = _list_of(_within(_int, lambda v: v >= 0, "a GPU index >= 0"),
                     "GPU indices, e.g. [0, 1]")


def _mapping(ctx: _Ctx, node: yaml.Node, where: str, fields: dict) -> dict[str, Any]:
    """Convert a YAML mapping whose allowed keys and converters are given by ``fields``."""
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, where, "expected a mapping of key: value")
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = _scalar(ctx, key_node, where)
        sub = f"{where}.{key}" if where else str(key)
        if key not in fields:
            allowed = ", ".join(sorted(fields))
            raise ctx.fail(key_node, sub, f"unknown key {key!r} (allowed: {allowed})")
        if key in out:
            raise ctx.fail(key_node, sub, "given twice")
        out[key] = fields[key](ctx, value_node, sub)
    return out


_positive = _within(_num, lambda v: 0 < v < float("inf"), "a number > 0")


def _per_user(ctx: _Ctx, node: yaml.Node, where: str,
              value: Callable[[_Ctx, yaml.Node, str], Any], expected: str) -> dict[str, Any]:
    """A mapping of user name -> ``value`` (each user once): shares, addresses."""
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, where, f"expected a mapping of {expected}")
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        user = _word(ctx, key_node, where)
        if user in out:
            raise ctx.fail(key_node, f"{where}.{user}", "given twice")
        out[user] = value(ctx, value_node, f"{where}.{user}")
    return out


def _shares(ctx: _Ctx, node: yaml.Node, where: str) -> tuple[tuple[str, float], ...]:
    """``{alice: 2, bob: 1}``: each user's share (a number > 0; the unlisted have 1)."""
    return tuple(sorted(_per_user(ctx, node, where, _positive,
                                  "user: share, e.g. {alice: 2}").items()))


# A half-life of 0 would forget usage at once (fair share off in disguise); the weight may be 0
# (computed and shown in `queue why`, not yet applied: a lab can watch before it switches on).
_FAIRSHARE_FIELDS = {"half_life_days": _positive,
                     "weight": _within(_num, lambda v: 0 <= v < float("inf"), "a number >= 0"),
                     "shares": _shares}



def _fairshare(ctx: _Ctx, node: yaml.Node, where: str) -> FairShare:
    """Present: on (``{}``: with the defaults); absent: off."""
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, where, "expected a mapping such as {half_life_days: 7, weight: "
                                    "10, shares: {alice: 2}} ({} for the defaults; leave "
                                    "fairshare out to turn it off)")
    return FairShare(**_mapping(ctx, node, where, _FAIRSHARE_FIELDS))


# --------------------------------------------------------------------------- schema
# Each field's converter checks its type and its range; "what is allowed" is in the message.
_NODE_FIELDS = {
    # The name is part of job directory paths on the node and of every message: keep it plain.
    "name": _within(_str, _NAME.fullmatch, "a name of letters, digits, '.', '_' and '-', "
                                           "starting with a letter or digit"),
    "host": _word, "user": _word,
    "port": _within(_int, lambda v: 1 <= v <= 65535, "a port number from 1 to 65535"),
    "identity_file": _within(_str, bool, "a path to a private key file"),
    "gpus": _gpu_list, "labels": _str_list, "local": _bool, "max_jobs_per_gpu": _per_gpu,
    # Relative paths start at the node account's home (nodes.local does the same); only a bare
    # ``~`` or ``~/`` is expanded there (nodes.gpu.remote_path): ``~alice/x`` would not be.
    "workdir": _within(_str, lambda v: v != "" and (v[0] != "~" or v == "~" or v[:2] == "~/"),
                       "a directory path (absolute, ~/..., or relative to the node's home)"),
    **RUN_AS_FIELDS, "shared_paths": _shared_paths,
    # host resources counted against jobs' --mem and --cpus-per-task (scheduler/hostres.py)
    "host_mem": _host_mem, "cpus": _per_gpu,
}
_ADAPT_FIELDS = {
    "enabled": _bool, "stop_partners": _bool, "suspend": _bool, "phase": _bool,
    "yield_opportunistic": _bool,
    "observe_s": _at_least_0, "polls": _per_gpu, "phase_persist_s": _at_least_0,
    # Like the margins: below a few times the +-2% measurement spread it would act on noise.
    "phase_threshold": _within(_num, lambda v: 0.05 <= v < 10, "a relative rate change in "
                                                               "[0.05, 10)"),
    "phase_util": _within(_num, lambda v: 5 <= v <= 100, "percentage points in [5, 100]"),
    # Below the measurements' own spread (+-2%) a margin would act on noise.
    "margin": _within(_num, lambda v: 0.02 <= v < 1, "a speed margin in [0.02, 1)"),
    "serial_margin": _within(_num, lambda v: 0 <= v < 1, "a speed margin in [0, 1)"),
    "window_s": _within(_num, lambda v: v > 0, "seconds > 0"),
    "busy_util": _within(_num, lambda v: 0 <= v <= 100, "a utilisation in [0, 100] %"),
    "max_suspend_s": _within(_num, lambda v: 0 < v < float("inf"), "seconds > 0"),
}
_POLICY_FIELDS = {
    "sharing": _within(_str, lambda v: v in SHARING_RULES,
                       f"one of {', '.join(SHARING_RULES)} (how sharing is judged)"),
    # Sharing must pay: below 1.0 two jobs would together do less than one alone.
    "share_threshold": _within(_num, lambda v: v >= 1, "a number >= 1.0 (the combined "
                                                       "predicted speed sharing must reach)"),
    "min_speed": _within(_num, lambda v: 0 < v <= 1, "a speed in (0, 1] (1.0: never slowed)"),
    "max_jobs_per_gpu": _per_gpu, "memory_margin_gib": _at_least_0,
    "aging_per_hour": _at_least_0, "reserve_after_s": _at_least_0,
    "fairshare": _fairshare,
    "adapt": lambda ctx, n, w: AdaptPolicy(**_mapping(ctx, n, w, _ADAPT_FIELDS)),
    "self_tune": _bool,
    # a replay costs seconds to minutes of a core (a niced child, one at a time)
    "tune_every": lambda ctx, n, w: _within(_duration, lambda v: v >= 1,
                                            "a duration of at least 1 s")(ctx, n, w),
    "tune_days": _within(_num, lambda v: 0 < v <= 365, "a number of days in (0, 365]"),
    # YAML 1.1 reads a bare off as false: the same
    "preemption": lambda ctx, n, w: _preemption(ctx, n, w),
    # a checkpoint of a large model takes minutes; a day would keep a waiting job waiting
    "preempt_grace": lambda ctx, n, w: _within(_duration, lambda v: 1 <= v <= 86400,
                                               "a duration from 1 s to 1 day")(ctx, n, w),
    "cold_start": _within(_str, lambda v: v in COLD_START_RULES,
                          f"one of {', '.join(COLD_START_RULES)} (how a program with no "
                          "profile yet is profiled)"),
}
TUNABLE_KEYS = ("max_jobs_per_gpu", "min_speed", "sharing")   # sim/whatif.py tries these


def _policy(ctx: _Ctx, node: yaml.Node, where: str) -> Policy:
    """``lab.policy``; the tunable keys it gives are pinned (self-tuning leaves them)."""
    given = _mapping(ctx, node, where, _POLICY_FIELDS)
    renamed = {"tune_every": "tune_every_s", "preempt_grace": "preempt_grace_s"}
    fields = {renamed.get(k, k): v for k, v in given.items()}
    return Policy(**fields, pinned=tuple(k for k in TUNABLE_KEYS if k in given))

def _preemption(ctx: _Ctx, node: yaml.Node, where: str) -> str:
    """``policy.preemption``: one of PREEMPTION_RULES; YAML reads a bare ``off`` as false,
    which means "off" here too."""
    value = _scalar(ctx, node, where)
    if value is False:
        value = "off"
    if value not in PREEMPTION_RULES:
        raise ctx.fail(node, where, f"expected one of {', '.join(PREEMPTION_RULES)} (whether "
                                    f"plan() may preempt --requeue jobs), got {value!r}")
    return str(value)

# 0 is allowed: it stops a user from starting jobs without removing their account.
_LIMIT_FIELDS = {"max_gpus": _count, "max_jobs": _count}
MIN_POLL_INTERVAL_S = 0.1   # below this the controller would spin on its nodes


def _user_limits(ctx: _Ctx, node: yaml.Node, where: str) -> dict[str, UserLimit]:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, where, "expected a mapping of user: {max_gpus: N, max_jobs: N}")
    out = {}
    for key_node, value_node in node.value:
        user = _word(ctx, key_node, where)
        out[user] = UserLimit(**_mapping(ctx, value_node, f"{where}.{user}", _LIMIT_FIELDS))
    return out


def _duration(ctx: _Ctx, node: yaml.Node, where: str) -> float:
    """Seconds, given as a number or as the command line writes durations (``7d``, ``12h``,
    ``30m``, ``2:00:00``, ``3-0``: ``text.parse_duration``)."""
    from .text import DURATION_FORMS, parse_duration

    value = _scalar(ctx, node, where)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds: float | None = float(value)
    else:
        seconds = None if isinstance(value, bool) else parse_duration(str(value), bare_s=1)
    if seconds is None or not 0 <= seconds < float("inf"):
        raise ctx.fail(node, where, f"expected a duration ({DURATION_FORMS}, or seconds), "
                                    f"got {value!r}")
    return seconds


# An address as it may go into a To: header: one mailbox, nothing a header could be split at.
_ADDRESS = re.compile(r"[^@\s<>,;:\"'()\[\]\\]+@[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
_address = _within(_str, _ADDRESS.fullmatch, "one e-mail address, e.g. alice@lab.example.org")


def _address_pattern(ctx: _Ctx, node: yaml.Node, where: str) -> str:
    """A pattern such as ``{user}@lab.example.org``: ``{user}`` is its only field, and it makes
    an address for any account name (letters, digits, '.', '_', '-')."""
    value = _str(ctx, node, where)
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
    except ValueError as exc:
        raise ctx.fail(node, where, f"cannot read pattern {value!r}: {exc}") from None
    if fields != {"user"} or not _ADDRESS.fullmatch(value.format(user="a.b_c-1")):
        raise ctx.fail(node, where, f"expected an address pattern with {{user}} as its only "
                                    f"field, e.g. '{{user}}@lab.example.org', got {value!r}")
    return value


def _addresses(ctx: _Ctx, node: yaml.Node, where: str) -> dict[str, str]:
    return _per_user(ctx, node, where, _address, "user: address")


def _smtp(ctx: _Ctx, node: yaml.Node, where: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:25`` for an IPv6 address)."""
    value = _str(ctx, node, where)
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (not sep or not host or any(c.isspace() or c in "[]/@" for c in host)
            or not port.isdigit() or not 1 <= int(port) <= 65535):
        raise ctx.fail(node, where, f"expected host:port of an SMTP server, e.g. "
                                    f"mail.lab.example.org:25, got {value!r}")
    return host, int(port)


def _webhook(ctx: _Ctx, node: yaml.Node, where: str) -> str:
    value = _str(ctx, node, where)
    try:
        url = urllib.parse.urlsplit(value)
        url.port   # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        url = None
    if (url is None or url.scheme not in ("http", "https") or not url.hostname
            or any(c.isspace() or not c.isprintable() for c in value)):
        raise ctx.fail(node, where, "expected an http:// or https:// URL, e.g. "
                                    "https://hooks.slack.com/services/...")
    return value


def _login_file(ctx: _Ctx, node: yaml.Node, where: str) -> str:
    """The SMTP login's file: it must exist, be readable here, and be closed to everyone but
    its owner (it holds a password); read again at each send, so it can be rotated in place."""
    value = os.path.expanduser(_str(ctx, node, where))
    try:
        mode = os.stat(value).st_mode
        readable = os.access(value, os.R_OK)
    except OSError as exc:
        raise ctx.fail(node, where, f"cannot read {value}: {exc.strerror}") from None
    if not readable:
        raise ctx.fail(node, where, f"{value} is not readable by this account (the "
                                    "controller's)")
    if mode & 0o077:
        raise ctx.fail(node, where, f"{value} is open to other accounts (mode "
                                    f"{mode & 0o777:o}); it holds a password: chmod 600 it")
    return value


SMTP_TLS = ("none", "starttls", "tls")
WEBHOOK_FORMATS = ("auto", "slack", "mattermost", "discord", "teams", "ntfy", "json")
_NOTIFY_FIELDS = {
    "default": _within(_str, lambda v: v in NOTIFY_WHEN, f"one of {', '.join(NOTIFY_WHEN)}"),
    "smtp": _smtp, "from": _address, "address": _address_pattern, "addresses": _addresses,
    "webhook": _webhook,
    "tls": _within(_str, lambda v: v in SMTP_TLS, f"one of {', '.join(SMTP_TLS)}"),
    "login_file": _login_file,
    "ca_file": _within(_str, lambda v: os.path.isfile(os.path.expanduser(v)),
                       "a file of CA certificates (PEM) that exists"),
    "webhook_format": _within(_str, lambda v: v in WEBHOOK_FORMATS,
                              f"one of {', '.join(WEBHOOK_FORMATS)}"),
}


def _notify(ctx: _Ctx, node: yaml.Node, where: str) -> NotifySettings:
    """The notification channels. A setting that could never take effect is refused where it
    is written: e-mail settings without a server, a server without a way to find addresses,
    and a default other than ``none`` without any channel."""
    values = _mapping(ctx, node, where, _NOTIFY_FIELDS)
    at = {k.value: k for k, _ in node.value}
    mail = [k for k in ("from", "address", "addresses") if k in values]
    if mail and "smtp" not in values:
        raise ctx.fail(at[mail[0]], f"{where}.{mail[0]}",
                       "e-mail settings need the SMTP server: add smtp: host:port")
    if "smtp" in values and not {"address", "addresses"} & set(values):
        raise ctx.fail(at["smtp"], f"{where}.smtp", "e-mail needs users' addresses: add "
                       "address: '{user}@your.domain' and/or addresses: {user: address}")
    tls = values.get("tls", "none")
    for key in ("tls", "login_file", "ca_file"):
        if key in values and "smtp" not in values:
            raise ctx.fail(at[key], f"{where}.{key}", "an SMTP setting needs the server: add "
                           "smtp: host:port")
    if "login_file" in values and tls == "none":
        raise ctx.fail(at["login_file"], f"{where}.login_file", "a login needs tls: starttls "
                       "or tls (a password is never sent in clear)")
    if "webhook_format" in values and "webhook" not in values:
        raise ctx.fail(at["webhook_format"], f"{where}.webhook_format", "needs webhook: URL")
    if values.get("default", "none") != "none" and not {"smtp", "webhook"} & set(values):
        raise ctx.fail(at["default"], f"{where}.default", "a default other than none needs a "
                       "channel: add smtp: host:port (with address) or webhook: URL")
    ca = values.get("ca_file")
    return NotifySettings(default=values.get("default", "none"), smtp=values.get("smtp"),
                          smtp_tls=tls, smtp_login_file=values.get("login_file"),
                          smtp_ca_file=None if ca is None else os.path.expanduser(ca),
                          sender=values.get("from"), address=values.get("address"),
                          addresses=values.get("addresses", {}), webhook=values.get("webhook"),
                          webhook_format=values.get("webhook_format", "auto"))


def _listen(ctx: _Ctx, node: yaml.Node, where: str) -> tuple[str, int]:
    value = _str(ctx, node, where)
    listen = parse_listen(value)
    if listen is None:
        raise ctx.fail(node, where, f"expected HOST:PORT, e.g. 127.0.0.1:9464, got {value!r}")
    return listen


_METRICS_FIELDS = {"listen": _listen, "allow_remote": _bool, "legacy_hours": _bool}


def _metrics(ctx: _Ctx, node: yaml.Node, where: str) -> MetricsSettings:
    """Refused where it is written: an address other than loopback without allow_remote."""
    values = _mapping(ctx, node, where, _METRICS_FIELDS)
    settings = MetricsSettings(**values)
    if (settings.listen is not None and not settings.allow_remote
            and not is_loopback(settings.listen[0])):
        at = next(v for k, v in node.value if k.value == "listen")
        raise ctx.fail(at, f"{where}.listen", "not a loopback address: whoever reaches it "
                       "would see the lab's users, jobs and nodes; add allow_remote: true "
                       "if the lab wants that")
    return settings


_LAB_FIELDS = {
    "admins": _str_list,
    "poll_interval": _within(_num, lambda v: v >= MIN_POLL_INTERVAL_S,
                             f"seconds >= {MIN_POLL_INTERVAL_S:g}"),
    "node_grace": _within(_num, lambda v: v > 0, "seconds > 0"),
    "default_retries": _count,
    "policy": _policy,
    "user_limits": _user_limits, "job_dir_retention": _duration, "notify": _notify,
    "default_time_limit": _within(_duration, lambda v: v > 0, "a duration > 0"),
    "max_time_limit": _within(_duration, lambda v: v > 0, "a duration > 0"),
    "interactive_time_limit": _within(_duration, lambda v: v > 0, "a duration > 0 (e.g. 8h)"),
    "interactive_grace": _within(_duration, lambda v: v > 0, "a duration > 0 (e.g. 1m)"),
    "reservation_ahead": _within(_duration, lambda v: v > 0, "a duration > 0 (e.g. 30d)"),
    "script_copies_gib": _positive,
    "kill_grace": _duration, "metrics": _metrics, "max_priority": _count,
    "idle_after": _within(_duration, lambda v: v > 0, "a duration > 0 (e.g. 30m)"),
    "idle_action": _within(_str, lambda v: v in IDLE_ACTIONS, " or ".join(IDLE_ACTIONS)),
    "idle_util": _within(_num, lambda v: 0 <= v < 100, "a GPU utilisation in % (0-99)"),
    **RUN_AS_FIELDS,   # defaults for every node that does not say
    "shared_paths": _shared_paths,   # likewise
}


def _lab(ctx: _Ctx, node: yaml.Node, where: str) -> dict[str, Any]:
    """The lab section. Silence is only noticed once per poll, so a grace shorter than the poll
    interval cannot be honoured: it is refused where it is written rather than stretched."""
    values = _mapping(ctx, node, where, _LAB_FIELDS)
    poll = values.get("poll_interval", Inventory.poll_interval_s)
    grace = values.get("node_grace", Inventory.node_grace_s)
    if grace < poll:
        key, allowed, got = (("node_grace", f">= lab.poll_interval ({poll:g})", grace)
                             if "node_grace" in values else
                             ("poll_interval", f"<= lab.node_grace ({grace:g})", poll))
        at = next(v for k, v in node.value if k.value == key)
        raise ctx.fail(at, f"lab.{key}", f"expected seconds {allowed}, got {got:g}")
    default, most = values.get("default_time_limit"), values.get("max_time_limit")
    if default is not None and most is not None and default > most:
        at = next(v for k, v in node.value if k.value == "default_time_limit")
        raise ctx.fail(at, "lab.default_time_limit", f"expected at most lab.max_time_limit "
                                                     f"({most:g} s), got {default:g} s")
    return values


def _nodes(ctx: _Ctx, node: yaml.Node, where: str, lab: dict[str, Any]) -> tuple[Node, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, where, "expected a list of nodes (each starting with '- name: ...')")
    result: list[Node] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(node.value):
        sub = f"nodes[{i}]"
        values = _mapping(ctx, item, sub, _NODE_FIELDS)
        for required in ("name", "host"):
            if required not in values and not (required == "host" and values.get("local")):
                raise ctx.fail(item, f"{sub}.{required}", "missing (every node needs it)")
        values.setdefault("host", "localhost")
        name = values["name"]
        if name in seen:
            raise ctx.fail(item, f"{sub}.name", f"duplicate node name {name!r} "
                                                f"(also nodes[{seen[name]}])")
        seen[name] = i
        if "shared_paths" not in values and "shared_paths" in lab:
            values["shared_paths"] = lab["shared_paths"]
        _run_as_defaults(ctx, item, sub, values, lab)
        if "host_mem" in values:
            values["host_mem_mib"] = values.pop("host_mem")
        result.append(Node(**values))
    return tuple(result)


def _run_as_defaults(ctx: _Ctx, item: yaml.Node, where: str, values: dict[str, Any],
                     lab: dict[str, Any]) -> None:
    """A node's run_as settings, from the node or else the lab's defaults; a node that runs
    jobs as their submitters must say who may be run as, else every job there would fail."""
    for key in RUN_AS_FIELDS:
        if key not in values and key in lab:
            values[key] = lab[key]
    if values.get("run_as") != "submitter":
        return
    if values.get("local"):
        raise ctx.fail(item, f"{where}.run_as", "run_as: submitter is not supported for a "
                                                "local node (its jobs run as the controller)")
    if not values.get("allowed_users") and not values.get("allowed_group"):
        raise ctx.fail(item, f"{where}.run_as", "run_as: submitter needs allowed_users or "
                                                "allowed_group (in lab or on the node): who "
                                                "may jobs run as")


_SLURM_FIELDS = {
    "partition": _word, "shards_per_gpu": _per_gpu,
    "gpu_type_prefix": _within(_str, lambda v: re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", v)
                               is not None, "letters, digits and '_', starting with a letter"),
    "gpu_memory_gib": _within(_num, lambda v: v > 0, "a number of GiB > 0"),
    "conf": _within(_str, lambda v: v.startswith("/"), "an absolute path to slurm.conf"),
    "account": _word,
}


def _slurm(ctx: _Ctx, node: yaml.Node, where: str) -> SlurmSettings:
    values = _mapping(ctx, node, where, _SLURM_FIELDS)
    if "partition" not in values:
        raise ctx.fail(node, where, "partition is missing: the Slurm partition whose nodes "
                                    "iadeep places jobs on")
    return SlurmSettings(**values)


# ``nodes`` is converted after ``lab`` (whose run_as settings are the nodes' defaults).
_TOP_FIELDS = {"lab": _lab, "nodes": lambda ctx, n, w: n, "slurm": _slurm}


def parse_inventory(text: str, path: Path) -> Inventory:
    """Validate YAML text (``path`` is only used in messages)."""
    ctx = _Ctx(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{line}: not valid YAML: {problem}",
                          hint="check indentation and quoting near that line") from None
    if root is None:
        return Inventory(nodes=(), path=path)
    top = _mapping(ctx, root, "", _TOP_FIELDS)
    lab = top.get("lab", {})
    nodes = _nodes(ctx, top["nodes"], "nodes", lab) if "nodes" in top else ()
    return Inventory(
        nodes=nodes,
        admins=lab.get("admins", ()),
        poll_interval_s=lab.get("poll_interval", 10.0),
        node_grace_s=lab.get("node_grace", 60.0),
        policy=lab.get("policy", Policy()),
        user_limits=lab.get("user_limits", {}),
        default_retries=lab.get("default_retries", 0),
        job_dir_retention_s=lab.get("job_dir_retention", 7 * 86400),
        default_time_limit_s=lab.get("default_time_limit"),
        max_time_limit_s=lab.get("max_time_limit"),
        interactive_time_limit_s=lab.get("interactive_time_limit",
                                         Inventory.interactive_time_limit_s),
        interactive_grace_s=lab.get("interactive_grace", Inventory.interactive_grace_s),
        reservation_ahead_s=lab.get("reservation_ahead", Inventory.reservation_ahead_s),
        script_copies_gib=lab.get("script_copies_gib", Inventory.script_copies_gib),
        kill_grace_s=lab.get("kill_grace", 10.0), max_priority=lab.get("max_priority", 10),
        notify=lab.get("notify", NotifySettings()),
        metrics=lab.get("metrics", MetricsSettings()),
        idle=IdleSettings(after_s=lab.get("idle_after", IdleSettings.after_s),
                          action=lab.get("idle_action", IdleSettings.action),
                          util=lab.get("idle_util", IdleSettings.util)),
        path=path,
        slurm=top.get("slurm"),
    )


def load_inventory(explicit: str | Path | None = None) -> Inventory:
    """Load and validate the inventory from ``--inventory``, ``$IADEEP_INVENTORY`` or the state dir.

    A missing file is an error, never an empty cluster: a controller started without its
    inventory would show the lab's nodes as they were last seen. An empty cluster is a file
    saying ``nodes: []``.
    """
    path = inventory_path(explicit)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        via = ("" if explicit else
               " (from $IADEEP_INVENTORY)" if os.environ.get("IADEEP_INVENTORY") else
               " (the default: no --inventory, no $IADEEP_INVENTORY)")
        raise ConfigError(f"{path}: inventory file not found{via}",
                          hint="pass --inventory FILE, set IADEEP_INVENTORY, or copy "
                               "nodes.yaml.example there; for no nodes write 'nodes: []'"
                          ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read inventory: {getattr(exc, 'strerror', None) or exc}",
                          hint="check the file's permissions and encoding (UTF-8)") from None
    return parse_inventory(text, path)

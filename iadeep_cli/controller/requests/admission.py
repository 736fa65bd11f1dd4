"""Who may queue a job at all, how high a member may set a job's priority, and how long a
member's job may sit idle before the lab's ``idle_action`` (``--idle-after``).

Decided at submission, with one line saying why and what to do, never at launch an hour (or
a 10,000-task array) later: a job is admitted when at least one node it may use could run it
as its owner, by the same rules the launch applies (``nodes.runas.check_user`` and the node's
own check for a ``run_as: submitter`` node, the backend's own for one whose backend runs every
job as its owner: ``Features.runs_as_owner``). A node whose
jobs run as its SSH account runs anyone's. What cannot be known here (a group defined only on
the nodes) is not refused here; the launch still checks it.
"""
from __future__ import annotations

import grp
import pwd
import re
from collections.abc import Iterable

from ...errors import InputError, PermissionDenied, RunAsRefused
from ...nodes import runas
from ...nodes.backend import features
from ...settings import Inventory, Node
from ...text import duration

# what the socket names a uid that has no account (``server.user_name``)
_NO_ACCOUNT = re.compile(r"uid\d+")


def _account(user: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(user)
    except KeyError:
        return None


def _why_not(node: Node, user: str) -> str | None:
    """Why ``user``'s job can never run on ``node``; None if it may."""
    kind = features(node.backend)
    if kind.runs_as_owner:
        entry = _account(user)
        if entry is None:
            return (f"{kind.label} node {node.name} runs jobs as their owners; {user} has no "
                    "account here")
        return f"iadeep never runs a job as root ({kind.label} node {node.name})" \
            if entry.pw_uid == 0 else None
    if not node.submitter:
        return None   # jobs run as the node's SSH account, whoever submitted them
    try:
        group = runas.check_user(node, user)
    except RunAsRefused as exc:
        return exc.message
    if user == node.user:
        return f"{user} is node {node.name}'s SSH account; jobs never run as it"
    if not group:
        return None
    try:
        members = grp.getgrnam(group)
    except KeyError:
        return None   # the group exists on the nodes only: the launch checks it there
    entry = _account(user)
    if user in members.gr_mem or (entry is not None and entry.pw_gid == members.gr_gid):
        return None
    return f"{user} is neither in allowed_users nor in group {group} (node {node.name})"


def check_admitted(user: str, nodes: Iterable[Node]) -> None:
    """PermissionDenied unless ``user`` has an account and one of ``nodes`` (those the job may
    use) could run their job; no nodes: nothing known yet, admitted."""
    if _NO_ACCOUNT.fullmatch(user) and _account(user) is None:
        raise PermissionDenied(f"{user} has no account on the controller's machine (a deleted "
                               "account?); jobs are queued only for existing accounts",
                               hint="submit from an existing account")
    reasons = [_why_not(n, user) for n in nodes]
    if not reasons or any(why is None for why in reasons):
        return
    shown = "; ".join(dict.fromkeys(r for r in reasons if r))
    raise PermissionDenied(f"{user} may not run jobs on any node this job could use: "
                           f"{shown[:400]}",
                           hint="ask a lab admin to add the account to allowed_users or "
                                "allowed_group in nodes.yaml")


def check_priority(inventory: Inventory, user: str, priority: int) -> None:
    """A member may raise a job's priority up to ``lab.max_priority``; admins above it."""
    if priority > inventory.max_priority and not inventory.is_admin(user):
        raise InputError(f"--priority {priority}: members may set at most "
                         f"{inventory.max_priority} (lab.max_priority)",
                         hint=f"use --priority {inventory.max_priority} or less, or ask a lab "
                              "admin (lab.admins) to raise it")


def check_idle_after(inventory: Inventory, user: str, idle_after_s: float | None) -> None:
    """A member's ``--idle-after`` may shorten the lab's ``idle_after``, never lengthen it (a
    year would opt the job out of ``idle_action``); admins may set any."""
    lab = inventory.idle.after_s
    if idle_after_s is not None and idle_after_s > lab and not inventory.is_admin(user):
        raise InputError(f"--idle-after {duration(idle_after_s)}: members may set at most the "
                         f"lab's idle_after ({duration(lab)})",
                         hint=f"use --idle-after {duration(lab)} or less, or ask a lab admin "
                              "(lab.admins)")

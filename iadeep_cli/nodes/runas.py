"""Shell that touches a job runs as the job's submitter on ``run_as: submitter`` nodes.

The controller still logs in as the node's SSH account; every script that touches a job
(launch, the job-state part of a poll, cancel, reading its log or progress, setting its
directory aside, cleaning it up) goes through ``GUARD``, which checks the account and then runs
``sudo -n -u USER -- /bin/sh -c SCRIPT``.  Running everything that touches a job as its owner
is the security boundary: the job's directory is the owner's (under their own home, 0700), and
whatever the owner puts there (a symlink to another user's file, a FIFO, a forged pid) is met
with the owner's own permissions, so it can never make the controller read, write or kill
anything the owner could not themselves.  The most an owner can do is mislead the controller
about their own jobs.

The account is checked twice, by whoever sees it first: here (a valid name, never root, one
of ``allowed_users`` or else checked on the node for ``allowed_group``), and on the node by
``GUARD`` (it exists, its uid is not 0, it is not the SSH account itself, it is in the group),
before sudo's own rule (docs/security.md) decides.  ``GUARD`` exits 90 (this user
cannot be run as here), 91 (sudo refuses: nobody can be run as here) or 92 (the user has no
home directory there); anything else is the script's own exit status.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ..errors import NodeError, RunAsRefused
from ..inventory import ACCOUNT_NAME
from ..settings import Node
from .connection import NodeAccess, as_command

REFUSED, SUDO_REFUSED, NO_HOME = 90, 91, 92
ACCOUNT_MARK = "iadeep-runas-account: "   # GUARD's line naming the SSH account (for sudoers)

# Runs as the SSH account: $1 user, $2 group to check (empty: the user is in allowed_users),
# $3 the script.  sudo's own message (a password is required, unknown user...) is passed on,
# and where sudo refuses, the SSH account's name (for the sudoers line to add: ``refusal``).
GUARD = r"""u=$1; g=$2; s=$3
fail() { c=$1; shift; echo "iadeep-runas: $*" >&2; exit "$c"; }
i=$(id -u -- "$u" 2>/dev/null) || fail 90 "user $u does not exist on this node"
[ "$i" != 0 ] || fail 90 "user $u is root; iadeep never runs a job as root"
[ "$u" != "$(id -un)" ] || fail 90 "user $u is this node's SSH account; jobs never run as it"
if [ -n "$g" ]; then
  id -Gn -- "$u" | tr ' ' '\n' | grep -qxF -- "$g" ||
    fail 90 "user $u is neither in allowed_users nor in group $g on this node"
fi
nosudo() { echo "iadeep-runas-account: $(id -un)" >&2; fail 91 "$*"; }
command -v sudo >/dev/null 2>&1 || nosudo "sudo is not installed on this node"
e=$(sudo -n -u "$u" -- /bin/sh -c : 2>&1 </dev/null) ||
  nosudo "sudo -n -u $u refused: $(printf '%s\n' "$e" | tail -n 1)"
exec sudo -n -u "$u" -- /bin/sh -c "$s"
"""
# Runs as the user first: HOME from the password database (not from whatever sudo keeps),
# so a job's directory is always under the user's own home.
_INNER = r"""HOME=$(getent passwd "$(id -u)" | cut -d: -f6); export HOME
case $HOME in /*) ;; *) echo "iadeep-runas: $(id -un) has no home directory" >&2; exit 92;; esac
cd "$HOME" 2>/dev/null || {
  echo "iadeep-runas: home directory $HOME of $(id -un) is missing on this node" >&2; exit 92; }
"""
WORKDIR_ROOT = "~/.iadeep"


def user_workdir(node: Node) -> str:
    """Where a submitter's jobs live on ``node``: ``~/.iadeep/<install id>/<node>`` of their
    own home (``Node.scope`` is ``<install id>/<node>``, set by the controller), which nobody
    else can create, replace or read."""
    return f"{WORKDIR_ROOT}/{node.scope or node.name}"


def check_user(node: Node, user: str) -> str:
    """The group the node must check ``user`` against ('' if ``allowed_users`` lists them);
    RunAsRefused for a user that may never be run as on this node."""
    hint = (f"add the account to allowed_users or allowed_group for node {node.name} in "
            "nodes.yaml, or submit from an account that is there")
    if not ACCOUNT_NAME.fullmatch(user) or user == "root":
        raise RunAsRefused(f"cannot run a job as {user!r} on node {node.name}: "
                           f"{'root is never run as' if user == 'root' else 'not an account name'}",
                           hint=hint)
    if user in node.allowed_users:
        return ""
    if node.allowed_group:
        return node.allowed_group
    raise RunAsRefused(f"cannot run a job as {user} on node {node.name}: {user} is not in "
                       "its allowed_users", hint=hint)


def command(node: Node, user: str, script: str) -> list[str]:
    """The argv that runs ``script`` (POSIX sh) as ``user`` on ``node`` (every part quoted by
    the connection: ``as_command``)."""
    group = check_user(node, user)
    return ["sh", "-c", GUARD, "iadeep-as", user, group, _INNER + script]


def run(pool: NodeAccess, node: str, user: str, script: str, timeout: float | None = None,
        stdin: bytes | None = None) -> tuple[int, str, str]:
    """(rc, stdout, stderr) of ``script`` run as ``user``; RunAsRefused when it could not run
    as them at all (nothing of the script ran then)."""
    rc, out, err = pool.run(node, command(pool.node(node), user, script), timeout=timeout,
                            stdin=stdin)
    if rc in (REFUSED, SUDO_REFUSED, NO_HOME):
        raise refusal(pool.node(node), user, rc, err)
    return rc, out, err


def sudoers_line(account: str, node: Node) -> str:
    """The sudoers line (docs/security.md) that lets ``account``, the node's SSH account, run
    /bin/sh as the users ``node`` allows (its group's members and the listed names), never as
    root."""
    runas = ([f"%{node.allowed_group}"] if node.allowed_group else []) + list(node.allowed_users)
    return f"{account} ALL=({','.join([*runas, '!root'])}) NOPASSWD: /bin/sh"


def refusal(node: Node, user: str, rc: int, err: str) -> RunAsRefused:
    """What ``GUARD``'s exit status ``rc`` and its stderr ``err`` mean for ``node``: a sudo
    refusal names the sudoers line to add there (with the SSH account the node said it runs
    as, else the inventory's ``user``)."""
    lines = err.splitlines()
    why = next((ln[len("iadeep-runas: "):] for ln in reversed(lines)
                if ln.startswith("iadeep-runas: ")), err.strip()[-200:] or f"exit {rc}")
    if rc == SUDO_REFUSED:
        said = [ln[len(ACCOUNT_MARK):].strip() for ln in lines if ln.startswith(ACCOUNT_MARK)]
        account = next((a for a in said if ACCOUNT_NAME.fullmatch(a)), node.user or "ACCOUNT")
        return RunAsRefused(
            f"node {node.name} cannot run jobs as their submitters: {why}; add "
            f"`{sudoers_line(account, node)}` there (visudo -f /etc/sudoers.d/iadeep)",
            hint="docs/security.md explains the line; check with `iadeep nodes check`",
            node_wide=True)
    return RunAsRefused(f"cannot run a job as {user} on node {node.name}: {why}",
                        hint="ask an admin to create the account (with its home directory) on "
                             "the node, or to allow it in nodes.yaml")


# Lists this user's processes tagged with a job id (IADEEP_JOB_ID in their environment):
# ``PID JOB`` lines.  Only the SSH account's poll sees them otherwise if it is root.
_TAGS = r"""for f in $(grep -lszF IADEEP_JOB_ID= /proc/[0-9]*/environ); do
  x=${f#/proc/}; x=${x%/environ}; [ "$x" != $$ ] && [ -O "/proc/$x" ] || continue
  j=$(tr '\0' '\n' < "$f" 2>/dev/null | sed -n 's/^IADEEP_JOB_ID=//p' | head -n 1)
  case $j in ''|*[!0-9]*) continue;; esac; echo "$x $j"
done
"""
SECTION_MAX = 1 << 18   # bytes of one user's poll section the controller reads


def poll_sections(node: Node, by_user: Mapping[str, str], timeout_s: float) -> str:
    """Shell (run as the SSH account) for the per-user part of a poll: for each user, their
    ``state_script`` (``by_user``) and their tagged processes, run as them, one sudo each.

    The user's output is captured to a file and read back bounded, every line prefixed with
    ``| `` so it can never pass for a marker line, and the section's exit status is printed
    by the SSH account after it: a user's processes cannot forge another user's section, hold
    the poll open (a daemon keeping the pipe), or make the node look silent.  A user who
    cannot be run as is reported too (``as-rc`` not 0) and their jobs' states are unknown."""
    mark = "@@iadeep"
    out = ['t=""; command -v timeout >/dev/null 2>&1 && '
           f't="timeout -k 2 {float(timeout_s):g}"\n',
           'f=$(mktemp) || { echo "@@iadeep as-failed mktemp"; f=/dev/null; }\n']
    for user, script in sorted(by_user.items()):
        try:
            argv = command(node, user, script + f'echo "{mark} tags"\n' + _TAGS)
        except RunAsRefused as exc:
            out.append(f"echo {shlex.quote(f'{mark} as:{user}')}\n"
                       f"echo {shlex.quote('| iadeep-runas: ' + exc.message)}\n"
                       f"echo {shlex.quote(f'{mark} as-rc:{user} {REFUSED}')}\n")
            continue
        out.append(
            f"echo {shlex.quote(f'{mark} as:{user}')}\n"
            f"$t {as_command(argv)} >\"$f\" 2>&1 </dev/null; r=$?\n"
            f"head -c {SECTION_MAX} \"$f\" | sed 's/^/| /'; echo\n"
            f"echo {shlex.quote(f'{mark} as-rc:{user}')} \"$r\"\n")
    out.append('[ "$f" = /dev/null ] || rm -f "$f"\n')
    return "".join(out)


def probe(pool: NodeAccess, node: str) -> tuple[str | None, str | None]:
    """(the user tried, why run_as: submitter does not work on ``node``, or None if it does):
    ``sudo -n -u USER true`` through ``GUARD``, for the allowed users in turn (allowed_users,
    then the first member of allowed_group there) until one works or sudo refuses: an allowed
    user without an account on this node says nothing about the node."""
    n = pool.node(node)
    users = list(n.allowed_users)
    if n.allowed_group:
        _, out, _ = pool.run(node, ["sh", "-c", 'getent group "$1" | cut -d: -f4 | cut -d, -f1',
                                    "iadeep-probe", n.allowed_group])
        users += [u for u in [out.strip()] if u and u not in users]
    if not users:
        return None, (f"no allowed user to try: allowed_users is empty and group "
                      f"{n.allowed_group} has no members listed on {node}")
    tried: tuple[str | None, str | None] = (None, None)
    for user in users:
        try:
            rc, _, err = run(pool, node, user, "true\n")
        except RunAsRefused as exc:
            tried = (user, exc.message)
            if exc.node_wide:
                return tried
            continue
        except NodeError as exc:
            return user, exc.message
        return user, None if rc == 0 else f"sudo ran but `true` exited {rc}: {err.strip()[-200:]}"
    return tried


def group_by_owner(ids: Sequence[int], owners: Mapping[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i in ids:
        out.setdefault(owners[i], []).append(i)
    return out

"""A node whose sudo refuses to run jobs as their submitters is told the sudoers line to add
(issue 47, item 4): ``runas.GUARD`` run by a real shell on this machine, on a PATH without
sudo (what a node without the package has), and the refusal ``runas.run`` raises from it."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from iadeep_cli.nodes import runas
from iadeep_cli.settings import Node


def _guard_without_sudo(tmp_path: Path, user: str) -> subprocess.CompletedProcess[str]:
    """GUARD as the shell on a node runs it, where the tools it needs are there but sudo is
    not."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("id", "tr", "grep", "tail", "printf"):
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    return subprocess.run(["/bin/sh", "-c", runas.GUARD, "iadeep-as", user, "", "true\n"],
                          capture_output=True, text=True, env={"PATH": str(tools)})


def test_a_sudo_refusal_names_the_sudoers_line_with_the_nodes_account_and_lab_group(tmp_path):
    me = pwd.getpwuid(os.getuid()).pw_name
    other = next(p.pw_name for p in pwd.getpwall()
                 if p.pw_uid not in (0, os.getuid()) and runas.ACCOUNT_NAME.fullmatch(p.pw_name))
    done = _guard_without_sudo(tmp_path, other)
    assert done.returncode == runas.SUDO_REFUSED, done.stderr
    node = Node("gpu2", host="gpu2", run_as="submitter", allowed_group="gpu-lab",
                allowed_users=("alice",))
    refused = runas.refusal(node, other, done.returncode, done.stderr)
    assert refused.node_wide
    assert refused.message.startswith("node gpu2 cannot run jobs as their submitters: sudo is "
                                      "not installed on this node; add "), refused.message
    # the account is the one the node's shell runs as, the run-as list the node's allowed users
    assert f"`{me} ALL=(%gpu-lab,alice,!root) NOPASSWD: /bin/sh` there" in refused.message
    assert "visudo -f /etc/sudoers.d/iadeep" in refused.message
    assert "iadeep nodes check" in (refused.hint or "")


def test_the_sudoers_line_is_the_documented_one_for_a_group_lab():
    node = Node("gpu2", host="gpu2", run_as="submitter", allowed_group="gpu-lab")
    line = runas.sudoers_line("iadeep", node)
    assert line == "iadeep ALL=(%gpu-lab,!root) NOPASSWD: /bin/sh"
    assert line in Path(__file__).parents[2].joinpath("docs/security.md").read_text()

"""`iadeep monitor` in a real 80x24 terminal (tmux, as a person at a laptop's shell sees it):
the banner is never cut mid-phrase, the footer shows every key, the help fits its box."""
from __future__ import annotations

import shutil
import subprocess
import time
import uuid

import pytest

from helpers.controllers import IADEEP, env_for, wait_until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is installed by `make test` (the sshd target)")


def _screen(session: str) -> list[str]:
    out = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                         text=True, check=True).stdout
    return out.splitlines()


@pytest.fixture
def monitor_80x24(tmp_path):
    """The real monitor on an empty state directory (its longest banner: never ran here)."""
    session = f"iadeep-monitor-{uuid.uuid4().hex[:8]}"
    env = env_for(tmp_path / "state")
    command = " ".join([*IADEEP, "monitor"])
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24",
                    "env", *(f"{k}={v}" for k, v in env.items()), "sh", "-c", command],
                   check=True)
    try:
        yield session
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_the_monitor_fits_an_80x24_terminal_banner_footer_and_help(monitor_80x24):
    session = monitor_80x24
    screen = wait_until(lambda: (s := _screen(session)) and "Help" in s[-1] and s, limit=60)
    banner = " ".join(line.strip() for line in screen[:2])
    assert banner.startswith("controller NOT running") and \
        banner.endswith("start it with `iadeep controller run`"), screen[:2]
    assert "…" not in banner
    footer = screen[-1]
    for key in ("Details", "Pane", "Quit", "Filter", "Cancel", "Hold", "Release", "? Help"):
        assert key in footer, footer

    subprocess.run(["tmux", "send-keys", "-t", session, "?"], check=True)
    screen = wait_until(lambda: (s := _screen(session)) and any("this help" in x for x in s)
                        and s, limit=30)
    box = [line.strip("│ ").rstrip() for line in screen if line.startswith("│")]
    # every key's line whole: none continues on a line of its own
    for phrase in ("switch between cluster and queue",
                   "cancel the selected job (asks first; owners and admins may)",
                   "foreign: a process iadeep did not start"):
        assert any(phrase in line for line in box), (phrase, screen)
    subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
    time.sleep(0.2)

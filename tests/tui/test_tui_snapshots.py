"""SVG snapshots of `iadeep monitor` on seeded stores (pytest-textual-snapshot).

Every screen is rendered at a fixed terminal size from data read through the real client, with
a fixed clock and no refresh timer, so the SVGs only change when the rendering does. Update them
after an intended change with ``pytest tests/tui/test_tui_snapshots.py --snapshot-update`` and look
at the report before committing.
"""
from __future__ import annotations

import threading

import pytest

from helpers import seed
from iadeep_cli.settings import Inventory, Node
from iadeep_cli.tui import source
from iadeep_cli.tui.app import MonitorApp

NOW = seed.NOW


def _seeded_app(scenario: str) -> MonitorApp:
    seed.seed_state_dir(scenario)
    return MonitorApp(initial=source.fetch(), now=lambda: NOW, user="alice", auto_refresh=False)


@pytest.fixture
def live_busy(home):
    """The busy cluster served by a real controller (clock fixed), so the banner is 'live'.
    Its inventory lists the seeded nodes (else they would show as no longer polled), but it
    never polls them: they do not exist."""
    from iadeep_cli.controller.runtime import Controller

    class ServeOnly(Controller):
        def _make_loop(self, inventory):
            return None

    seed.seed_state_dir("busy")
    ctl = ServeOnly(Inventory(nodes=(Node("gpu-a", "gpu-a"), Node("gpu-b", "gpu-b"))), home,
                    clock=lambda: NOW)
    ready = threading.Event()
    thread = threading.Thread(target=ctl.run, args=(ready.set,), daemon=True)
    thread.start()
    assert ready.wait(10)
    data = source.fetch()
    ctl.stop()
    thread.join(10)
    assert data.stale_since is None
    return MonitorApp(initial=data, now=lambda: NOW, user="alice", auto_refresh=False)


def test_empty_cluster_80x24(home, snap_compare):
    assert snap_compare(_seeded_app("empty"), terminal_size=(80, 24))


def test_busy_cluster_shared_gpus_120x40(live_busy, snap_compare):
    assert snap_compare(live_busy, terminal_size=(120, 40))


def test_busy_cluster_80x24(home, snap_compare):
    assert snap_compare(_seeded_app("busy"), terminal_size=(80, 24))


def test_node_down_120x40(home, snap_compare):
    assert snap_compare(_seeded_app("down"), terminal_size=(120, 40))


def test_long_queue_120x40(home, snap_compare):
    assert snap_compare(_seeded_app("long_queue"), terminal_size=(120, 40))


def test_long_queue_filtered_by_user_160x50(home, snap_compare):
    assert snap_compare(_seeded_app("long_queue"), terminal_size=(160, 50),
                        press=["slash", *"user:eve", "enter"])

"""`iadeep monitor`: the live terminal UI. Textual is imported inside the command only, so
every other command starts without paying for it."""
from __future__ import annotations

from .root import app


@app.command("monitor")
def monitor() -> None:
    """Watch the cluster and the queue live; cancel, hold and release jobs (keys: ? for help)."""
    from ..tui.app import MonitorApp

    MonitorApp().run()

"""Freeing the controller's copies of submitted scripts once their jobs are long finished
(``store/scripts.py`` says which, and bounds each member's)."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..store import Store, scripts

log = logging.getLogger("iadeep.controller")
FREE_EVERY_S = 60.0   # how often the controller looks for copies to free


def free(store: Store, scripts_dir: Path, retention_s: float, now: float,
         lab_bytes: int | None = None) -> list[int]:
    """Remove the copies whose jobs all ended over ``retention_s`` ago (a day, at most, while
    the copies hold over half of ``lab_bytes``: ``scripts.retention``); returns their ids.
    In one transaction: a rerun (which reads a copy) never sees half of it."""
    with store.tx() as conn:
        if lab_bytes is not None:
            retention_s = scripts.retention(conn, retention_s, lab_bytes)
        ids = scripts.freeable(conn, now - retention_s)
        for job_id in ids:
            shutil.rmtree(scripts_dir / str(int(job_id)), ignore_errors=True)
        scripts.freed(conn, ids, now)
    if ids:
        log.info("freed %d finished jobs' script copies", len(ids))
    return ids

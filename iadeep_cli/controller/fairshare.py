"""Fair share in the controller: each round's figures from the database, and what readers see.

``FairShareRound.points`` is called once per scheduling round, before ``plan()``: it feeds the
moves since the last round into a ``UsageLedger`` (the whole history once, summed in SQLite, at
the first round), works out every counting user's factor (``scheduler.fairshare``), records the
table in the database (``meta.fairshare``) for `queue why` and `queue show` when it changed,
and hands ``plan()`` the points per user. ``plan()`` never reads the database itself.

``priority_view`` is the other half: a waiting job's effective priority, part by part, from
that record and the aging the reader knows (the running controller's inventory, else the
controller's last heartbeat record): ``scheduler.priority``, the sum ``plan()`` ranks by.
"""
from __future__ import annotations

import sqlite3

from .. import messages as m
from ..jobs import PENDING
from ..scheduler import fairshare, priority
from ..settings import FairShare, Inventory, Policy
from ..store import Store, cluster, usage

META_KEY = "fairshare"


# The record is rewritten when a user's points move by this much (what `queue why` shows to two
# decimals) or users come or go, else at most every RECORD_EVERY_S: each write is a commit with
# fsync (~8 ms here), which a round should not pay for a figure that moved by 1e-5.
RECORD_STEP = 0.005
RECORD_EVERY_S = 30.0


class FairShareRound:
    """The loop's fair-share state: a ledger kept across rounds (rebuilt when the half-life
    changes on a reload; dropped, and its record deleted, when fair share is turned off)."""

    def __init__(self) -> None:
        self._ledger: fairshare.UsageLedger | None = None
        self._recorded = True   # a record from an earlier run may exist: delete it once
        self._written: tuple[float, dict[str, float]] | None = None   # (at, points) last kept

    def points(self, store: Store, policy: Policy, now: float) -> dict[str, float] | None:
        """Priority points per user for this round's ``plan()`` (None: fair share is off)."""
        settings = policy.fairshare
        if settings is None:
            self._ledger, self._written = None, None
            if self._recorded:
                with store.tx() as conn:
                    conn.execute("DELETE FROM meta WHERE key = ?", (META_KEY,))
                self._recorded = False
            return None
        with store.tx() as conn:
            ledger = self._ledger
            if ledger is None or ledger.half_life_s != settings.half_life_s:
                ledger = self._ledger = fairshare.UsageLedger(settings.half_life_s)
                cursor, sums, held = usage.history(conn, now, settings.half_life_s)
                ledger.restore(cursor, now, sums, held)
                self._written = None
            else:
                ledger.feed(usage.moves_after(conn, ledger.cursor))
            table = fairshare.shares(ledger.usage(now), usage.owners_with_jobs(conn), settings)
            points = fairshare.points(table)
            if self._stale(points, now):
                cluster.set_meta(conn, META_KEY, record(table, settings, now))
                self._written, self._recorded = (now, points), True
        return points

    def _stale(self, points: dict[str, float], now: float) -> bool:
        """Whether the recorded table no longer says what this round ranks by."""
        if self._written is None:
            return True
        at, before = self._written
        return (now - at >= RECORD_EVERY_S or before.keys() != points.keys()
                or any(abs(before[u] - p) >= RECORD_STEP for u, p in points.items()))


def record(table: dict[str, fairshare.UserShare], settings: FairShare, now: float) -> dict:
    """The round's table as stored in ``meta.fairshare``: one ``FairShareView`` per user."""
    return {"at": now, "users": {u: m.FairShareView(
        user=u, usage_gpu_h=s.usage_gpu_h, usage_norm=s.usage_norm, share=s.share,
        share_norm=s.share_norm, factor=s.factor, weight=settings.weight, points=s.points,
        half_life_days=settings.half_life_days, at=now).to_dict() for u, s in table.items()}}


def priority_view(conn: sqlite3.Connection, job: m.JobView, now: float,
                  inventory: Inventory | None) -> m.PriorityView | None:
    """A waiting job's effective priority in parts (None for a job that does not wait).

    With the controller's ``inventory`` (it runs) its policy decides whether fair share is on;
    without (read offline) the last round's record does, and the aging is the controller's
    last heartbeat's."""
    if job.state not in PENDING:
        return None
    if inventory is not None:
        aging_per_hour = inventory.policy.aging_per_hour
    else:
        heartbeat = m.ControllerView.from_dict(cluster.get_meta(conn, "controller", {}))
        aging_per_hour = priority.recorded_aging(heartbeat.aging_per_hour)
    users = last_round(conn, inventory)
    mine = (users or {}).get(job.owner)
    share = m.FairShareView.from_dict(mine) if mine else None
    on = users is not None
    bonus = {job.owner: share.points} if share else None
    return m.PriorityView(effective=priority.effective(job.priority, job.owner, job.submitted_at,
                                                       now, aging_per_hour, bonus),
                          base=job.priority,
                          aging=priority.aging(job.submitted_at, now, aging_per_hour),
                          aging_per_hour=aging_per_hour,
                          fairshare_on=on, fairshare=share)


def last_round(conn: sqlite3.Connection, inventory: Inventory | None) -> dict[str, dict] | None:
    """The last round's fair-share table (user -> its ``FairShareView`` as stored), None while
    fair share is off. With the controller's ``inventory`` its policy says whether it is on;
    without (read offline) whether a round recorded one."""
    if inventory is not None and inventory.policy.fairshare is None:
        return None
    recorded = cluster.get_meta(conn, META_KEY)
    if not recorded:
        return None if inventory is None else {}
    return dict(recorded.get("users", {}))


def points(conn: sqlite3.Connection, inventory: Inventory | None) -> dict[str, float] | None:
    """Each counted user's fair-share priority points from the last round (None: fair share
    is off), for readers that order the queue as the controller does (the monitor)."""
    users = last_round(conn, inventory)
    return None if users is None else {u: float(v["points"]) for u, v in users.items()}

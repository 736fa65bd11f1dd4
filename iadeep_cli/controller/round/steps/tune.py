"""Self-tuning: the controller replays the lab's recent history under candidate settings of
plan() (sim/whatif.py) and adopts a clearly better one.

Bounded in CPU: the replay runs as ``python -m iadeep_cli.sim.whatif`` in a child process
at low priority (``nice`` 10, like the model's refit), one at a time, at most every
``lab.policy.tune_every`` (6 h by default; the first one that long after the controller
starts), on the jobs submitted in the last ``tune_days`` (14) days (the newest
``whatif.MAX_REPLAY_JOBS`` of them: the replay's cost grows with the square of its jobs), and
only once at least
``MIN_JOBS`` of them ran to an end. The round thread only starts it and, later, reads its
answer: a round never waits for a replay.

Without flapping: a candidate is adopted only when its average JCT beats the settings in force
by ``MARGIN`` (3%) in ``STREAK`` (2) replays in a row, the same candidate both times. A key that
nodes.yaml gives (``lab.policy.max_jobs_per_gpu: 2``) is pinned: every candidate keeps its
value, so it is never changed; ``self_tune: false`` turns all of it off (and what was adopted
earlier no longer applies).

What it decided is recorded in the database (``meta`` key ``tune``) and shown by
`iadeep tune`; plan() stays pure: the adopted settings are a Policy like any other.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ....inventory import TUNABLE_KEYS
from ....settings import Inventory, Policy
from ....text import settings_label as label

if TYPE_CHECKING:
    from ....store import Store
    from ..context import Round

log = logging.getLogger("iadeep.controller")
MARGIN = 0.03       # a candidate must beat the settings in force by this (average JCT) ...
STREAK = 2          # ... in this many replays in a row to be adopted
MIN_JOBS = 20       # fewer finished jobs in the window: nothing to learn from, no replay
TIMEOUT_S = 1800.0  # a replay child still running after this is killed (and logged)
META = "tune"       # the record in the database's meta table
DAY_S = 86400.0


def policy_to_json(policy: Policy) -> dict[str, Any]:
    """The policy's plain settings (fair share left out: a replay ranks without it)."""
    out = dataclasses.asdict(dataclasses.replace(policy, fairshare=None))
    out.pop("fairshare")
    out["pinned"] = list(policy.pinned)
    return out


def tuned_policy(policy: Policy, adopted: dict[str, Any] | None) -> Policy:
    """``policy`` with the adopted settings, except the keys it pins; as it is when self-tuning
    is off or nothing was adopted."""
    if not policy.self_tune or not adopted:
        return policy
    change = {k: v for k, v in adopted.items() if k in TUNABLE_KEYS and k not in policy.pinned}
    return dataclasses.replace(policy, **change) if change else policy


def count_jobs(conn: sqlite3.Connection, since: float) -> int:
    """Jobs submitted since ``since`` that ran to an end (what a replay learns from)."""
    return int(conn.execute("SELECT COUNT(*) FROM jobs WHERE submitted_at >= ? AND started_at "
                            "IS NOT NULL AND ended_at IS NOT NULL", (since,)).fetchone()[0])


def verdict(table: dict[str, Any], margin: float = MARGIN
            ) -> tuple[dict[str, Any] | None, str]:
    """(the candidate that beats the settings in force by ``margin``, or None; why, in words)."""
    rows = table.get("outcomes") or []
    if not rows:
        return None, table.get("note", "nothing to replay")
    force = table["in_force"]
    mine = next((r for r in rows if r["settings"] == force), None)
    top = next(r for r in rows if r["settings"] == table["best"])
    if mine is None or top["settings"] == force:
        return None, f"the settings in force ({label(force)}) are the best of {len(rows)}"
    gain = 1.0 - top["avg_jct_s"] / mine["avg_jct_s"] if mine["avg_jct_s"] > 0 else 0.0
    if gain < margin:
        return None, (f"{label(top['settings'])} would cut the average JCT by only "
                      f"{gain:.1%} (< {margin:.0%}): keeping {label(force)}")
    return top["settings"], (f"cuts the average JCT by {gain:.1%} against {label(force)} "
                             f"({hours(top['avg_jct_s'])} vs {hours(mine['avg_jct_s'])})")


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


class SelfTuning:
    """The controller's side: ``applied`` gives the inventory whose policy is in force this
    round; ``step`` (once a round, on the round's thread) acts on the last replay's answer and
    starts a replay when one is due."""

    def __init__(self, store: Store, started: float):
        from ....store import cluster

        self.store = store
        with store.read() as conn:
            self.record: dict[str, Any] = cluster.get_meta(conn, META, {}) or {}
        self._since = started   # the first replay: tune_every after this
        self._last_at = float(self.record.get("at") or 0.0)
        self._thread: threading.Thread | None = None
        self._answer: dict[str, Any] | None = None
        self._cache: tuple[Policy, Policy] | None = None

    def applied(self, inventory: Inventory) -> Inventory:
        """``inventory`` with the adopted settings in its policy (the same object when none
        apply)."""
        base = inventory.policy
        if self._cache is None or self._cache[0] is not base:
            self._cache = (base, tuned_policy(base, self.record.get("adopted")))
            self._remember(base)
        tuned = self._cache[1]
        return inventory if tuned is base else dataclasses.replace(inventory, policy=tuned)

    def run(self, r: Round) -> None:
        self.step(r.now, r.inventory)   # a replay due, or its answer

    def step(self, now: float, inventory: Inventory) -> None:
        answer, self._answer = self._answer, None
        if answer is not None:
            self._decide(answer, inventory)
        policy = inventory.policy
        if not policy.self_tune or self._thread is not None:
            return
        if now < max(self._since, self._last_at) + policy.tune_every_s:
            return
        self._since = now   # whatever happens below, the next try is tune_every later
        with self.store.read() as conn:
            if count_jobs(conn, now - policy.tune_days * DAY_S) < MIN_JOBS:
                return
        tuned = self.applied(inventory).policy
        self._thread = threading.Thread(target=self._run, args=(tuned, policy.tune_days, now),
                                        name="iadeep-tune", daemon=True)
        self._thread.start()

    def _run(self, policy: Policy, days: float, now: float) -> None:
        out = self.store.path.with_name("tune-replay.json")
        args = [sys.executable, "-m", "iadeep_cli.sim.whatif", "--db", str(self.store.path),
                "--out", str(out), "--days", repr(days), "--now", repr(now),
                "--policy", json.dumps(policy_to_json(policy))]
        started = time.monotonic()
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                log.error("self-tuning's replay failed (exit %s: %s)", done.returncode, last)
            else:
                answer = json.loads(out.read_text(encoding="utf-8"))
                answer["wall_s"] = round(time.monotonic() - started, 2)
                self._answer = answer
        except Exception:   # keep scheduling with the settings in force
            log.exception("self-tuning's replay failed")
        finally:
            self._thread = None

    def _decide(self, table: dict[str, Any], inventory: Inventory) -> None:
        """Adopt with hysteresis; record the table and the decision."""
        from ....store import cluster

        rec = dict(self.record)
        choice, why = verdict(table)
        streak = int(rec.get("streak") or 0)
        if choice is not None and choice == rec.get("proposal"):
            streak += 1
        else:
            streak = 1 if choice is not None else 0
        rec.update(at=table["at"], table=table, why=why, proposal=choice, streak=streak)
        if choice is not None and streak >= STREAK:
            adopted = {**(rec.get("adopted") or {}),
                       **{k: v for k, v in choice.items() if k not in inventory.policy.pinned}}
            rec.update(adopted=adopted, adopted_at=table["at"], proposal=None, streak=0)
            rec["history"] = [*rec.get("history", [])[-9:],
                              {"at": table["at"], "settings": choice, "why": why}]
            log.info("self-tuning adopted %s: %s", label(choice), why)
        elif choice is not None:
            log.info("self-tuning: %s (%d of %d replays in a row)", why, streak, STREAK)
        self.record, self._last_at, self._cache = rec, float(table["at"]), None
        with self.store.tx() as conn:
            cluster.set_meta(conn, META, rec)

    def _remember(self, base: Policy) -> None:
        """The nodes.yaml policy beside the record, for `iadeep tune` (which cannot know which
        inventory file this controller reads)."""
        from ....store import cluster

        data = policy_to_json(base)
        if self.record.get("base") == data:
            return
        self.record = {**self.record, "base": data}
        with self.store.tx() as conn:
            cluster.set_meta(conn, META, self.record)

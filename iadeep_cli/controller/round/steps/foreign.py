"""Foreign idle GPU holders: GPU processes iadeep did not start that hold a GPU idle.

Every round, on each node that answered, each process on a GPU that is no job's (``foreign``:
``nodes/gpu.py`` job_map tells iadeep's own apart) starts or goes on with an idle spell while
its GPU reports a utilisation at or below ``lab.idle_util``; a poll above that, or the process
gone from the GPU, ends it. A spell of ``lab.idle_after`` is, once:

- recorded (``store/foreign.py``), so that `iadeep status` shows a line for it until it ends
  ("node01:1 held idle by pid 4242 (python, 20.0 GiB) for 35m, not an iadeep job");
- reported to the lab's admins (``lab.admins``) through the notification channels: the lab's
  webhook (``"event": "foreign_idle"``) and each admin's e-mail, kept until sent or given up
  and retried as a job's notification is (``notify.py``'s threads build and send them).

It is never acted on: iadeep does not stop what it did not start. A spell recorded before a
restart goes on (not reported again) while the process still holds the GPU idle.
"""
from __future__ import annotations

import logging
import sqlite3

from ....snapshot import ClusterSnapshot, GpuProcess
from ....store import foreign as rows, outbox
from ....text import foreign_idle_line as line
from ..context import Context, Round

log = logging.getLogger("iadeep.controller")
Key = tuple[str, int, int]      # (node, GPU index, pid)


class ForeignWatch:
    """Foreign processes' idle spells: (node, GPU, pid) -> since when; those recorded -> row."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.since: dict[Key, float] = {}
        self.marked: dict[Key, int] = {}
        self.loaded = False

    def run(self, r: Round) -> None:
        self.step(self.ctx, r.snapshot, r.now)

    def step(self, loop: Context, snapshot: ClusterSnapshot, now: float) -> list[int]:
        """Look at every foreign GPU process once; the ids of the spells recorded this round."""
        settings = loop.inventory.idle
        if not self.loaded:          # spells recorded by an earlier controller go on
            with loop.store.read() as conn:
                for spell in rows.open_spells(conn):
                    key = (spell.node, spell.gpu, spell.pid)
                    self.since[key], self.marked[key] = spell.since, spell.id
            self.loaded = True
        known = {n.name for n in snapshot.nodes}
        answered = {n.name for n in snapshot.nodes if n.reached}
        idle: dict[Key, GpuProcess] = {}
        for snap in snapshot.nodes:
            if snap.name not in answered:
                continue
            for sample in snap.gpus:
                util = sample.utilization_gpu
                if util is None or util > settings.util:
                    continue
                for proc in sample.foreign_processes:
                    idle[(snap.name, sample.index, proc.pid)] = proc
        over = [k for k in self.since if k not in idle and (k[0] in answered or k[0] not in known)]
        for key in over:
            self.since.pop(key, None)
        ended = [(k, self.marked.pop(k)) for k in over if k in self.marked]
        due = []
        for key, proc in idle.items():
            since = self.since.setdefault(key, now)
            if key not in self.marked and now - since >= settings.after_s:
                due.append((key, proc, since))
        if not ended and not due:
            return []
        made = []
        with loop.store.tx() as conn:
            for _, spell_id in ended:
                rows.end(conn, spell_id, now)
            for (node, gpu, pid), proc, since in due:
                spell_id = rows.add(conn, node, gpu, pid, proc.name or "", proc.used_memory_mib,
                                    since, now)
                self.marked[(node, gpu, pid)] = spell_id
                self._enqueue(loop, conn, spell_id, now)
                made.append(spell_id)
                log.warning("%s (reported to the admins)",
                            line(node, gpu, pid, proc.name, proc.used_memory_mib, now - since))
        return made

    @staticmethod
    def _enqueue(loop: Context, conn: sqlite3.Connection, spell_id: int, now: float) -> None:
        """One message per channel: the lab's webhook, and each admin's e-mail."""
        notify = loop.inventory.notify
        if notify.webhook is not None:
            outbox.enqueue_spell(conn, spell_id, "webhook", "", now)
        for admin in loop.inventory.admins:
            if notify.email_for(admin) is not None:
                outbox.enqueue_spell(conn, spell_id, "email", admin, now)

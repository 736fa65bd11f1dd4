"""Step: stop the running jobs past their time limit (``--time``), signalling first
(``--signal``), and the interactive ones whose client has gone (``lab.interactive_grace``)."""
from __future__ import annotations

import logging
from functools import partial

from ....errors import IadeepError
from ....jobs import Job, JobState, StopReason, parse_signal
from ....store import jobrows
from ....text import hms
from ..context import Round, Step

log = logging.getLogger("iadeep.controller")


class Limits(Step):
    def run(self, r: Round) -> None:
        self.ask(r.now)

    def ask(self, now: float) -> None:
        """Ask to stop each running job that has run past its time limit (``--time``, counted
        from this attempt's start). It is then stopped like a cancelled job (TERM, KILL after
        ``lab.kill_grace``) and recorded as ``timeout``, saying why. A job that asked for a
        ``--signal`` gets it first, its lead time before the limit (at most once an attempt:
        it is marked sent before it is sent)."""
        running = self.jobs({JobState.RUNNING})
        self._orphans(running, now)
        for job in running:
            limit, began = job.spec.time_limit_s, job.started_at
            if limit is None or began is None or job.stop_reason or job.node is None:
                continue
            began += job.suspended_s   # time suspended (steps/adaptation.py) is not counted
            if job.spec.signal and not job.signalled:
                name, lead = parse_signal(job.spec.signal)
                if now - began >= limit - lead:
                    with self.store.tx() as conn:
                        jobrows.update(conn, job.id, signalled=True)
                    self.actions.submit(job.node, ("signal", job.id),
                                        partial(self._signal, job.node, job.id, name,
                                                job.owner))
            if now - began < limit:
                continue
            log.info("job %d (%s/%s) reached its time limit %s; stopping it", job.id, job.owner,
                     job.name, hms(limit))
            with self.store.tx() as conn:
                jobrows.update(conn, job.id, stop_reason=StopReason.TIME_LIMIT,
                               reason=f"time limit {hms(limit)} reached; stopping it")

    def _orphans(self, running: list[Job], now: float) -> None:
        """Ask to stop each interactive job (``run --pty``) whose owner's client has not been
        heard from (log reads, keystrokes: ``controller/presence.Presence``) for more than
        ``lab.interactive_grace``: a client killed with SIGKILL cannot cancel it, and nobody
        can type into its shell again. Recorded as cancelled, saying why."""
        presence, grace = self.ctx.presence, self.ctx.inventory.interactive_grace_s
        presence.keep_only(j.id for j in running if j.spec.interactive)
        for job in running:
            if not job.spec.interactive or job.stop_reason:
                continue
            silent = presence.silent_for(job.id, now)
            if silent <= grace:
                continue
            log.info("job %d (%s/%s): its `run --pty` client has not been heard from for %s; "
                     "stopping it", job.id, job.owner, job.name, hms(silent))
            with self.store.tx() as conn:
                jobrows.update(conn, job.id, stop_reason=StopReason.CLIENT_GONE,
                               reason=f"its `iadeep run --pty` client has not been heard from "
                                      f"for {hms(silent)} (lab.interactive_grace "
                                      f"{hms(grace)}); stopping it")

    def _signal(self, node: str, job_id: int, name: str, owner: str) -> None:
        try:
            sent = self.pool.backend(node).signal(job_id, name, owner=owner)
            log.info("job %d: SIG%s before its time limit%s", job_id, name,
                     "" if sent else " not sent: nothing of it runs")
        except IadeepError as exc:
            log.warning("signalling job %s on %s failed: %s", job_id, node, exc.message)

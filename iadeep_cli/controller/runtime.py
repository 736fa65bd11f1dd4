"""Running the controller process: lock, socket, loop, clean stop on SIGINT/SIGTERM, inventory
reload on request or SIGHUP.

A sick state directory degrades the controller instead of stopping it (a crash-looping
service helps nobody): with too little room it refuses new jobs and keeps running the accepted
ones; with its database removed or replaced it stops writing, saves a copy of what it held and
refuses every request with the reason. Both are checked at every heartbeat and logged when
they change; room coming back is noticed by itself.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING

from .. import messages as m
from ..errors import ConfigError, IadeepError, NodeError, StoreError
from ..inventory import load_inventory
from ..nodes.backend import features
from ..nodes.connection import Pool
from ..paths import StateDir
from ..settings import Inventory
from ..store import cluster, is_damage, statedir
from .copies import FREE_EVERY_S, free as free_copies
from .notify import Notifier
from .renames import carry, dir_names, renamed
from .requests import offline
from .sdnotify import SystemdNotifier

if TYPE_CHECKING:   # prometheus_client loads only when metrics are on (_serve_metrics)
    from ..jobs import Job
    from .foresight import Foresight
    from .requests.metrics import MetricsServer
    from .round.loop import SchedulingLoop
from .requests.port import NodeWork
from .requests.server import ControllerSocket
from .requests.service import Service

log = logging.getLogger("iadeep.controller")
DAMAGE_CHECK_POLLS = 10   # a quick_check of the database on disk every this many polls
RELOAD_WAIT_S = 30.0   # a reload request waits this long for the current round to end
PUBLISH_EVERY_S = 30.0   # the public snapshot is read only while we are down; stop forces one


class Controller:
    """Owns the store, the socket and the scheduling loop for one state directory."""

    def __init__(self, inventory: Inventory, state_dir: Path | None = None,
                 clock: Callable[[], float] = time.time, new_database: bool = False,
                 metrics: tuple[str, int] | None = None,
                 round_done: Callable[[], None] = lambda: None):
        inventory = _with_backend_nodes(inventory)
        self.inventory = inventory
        self._round_done = round_done   # after each round: systemd's watchdog (sdnotify.py)
        self._metrics_at = metrics   # (host, port) to serve Prometheus metrics on; None: off
        self.metrics: MetricsServer | None = None
        self.state = StateDir(state_dir) if state_dir else StateDir.default()
        self.clock = clock
        self._stop = threading.Event()
        self._stopped_by = "stop requested"
        self._wake = threading.Event()
        # Validated inventories waiting for the main thread (see reload), and SIGHUP's flag.
        self._reloads: list[tuple[Inventory, Future | None]] = []
        self._reloads_lock = threading.Lock()
        self._hangup = False
        self.state.root.mkdir(parents=True, exist_ok=True)
        self.store, self.install_id = statedir.open_store(self.state, new_database=new_database)
        self.scripts_dir = self.state.scripts   # copies taken at submission: private
        self._copies_freed_at = float("-inf")
        self.scripts_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.scripts_dir, 0o700)
        self._degraded: IadeepError | None = None   # why new jobs are refused now (_degrade)
        # the service's port to this controller: wake, reload, degraded, nodes (requests/port.py)
        self.service = Service(self.store, inventory, clock, port=self,
                               scripts_dir=self.scripts_dir)
        self.socket = ControllerSocket(self.service, self.state)
        self.loop = self._make_loop(inventory) if inventory.nodes else None
        # Its own threads: a slow mail server or webhook never delays a round.
        self.notifier = Notifier(self.store, inventory.notify, self._notice_log, clock,
                                 every_s=min(10.0, max(1.0, inventory.poll_interval_s)))
        self.started_at = clock()
        self._published_at = float("-inf")
        self._rescued, self._rescue_failed = False, ""
        self._round_stopped: str | None = None
        # rounds failing one after another: (the first's time, how many, the last's error)
        self._rounds_failing: tuple[float, int, str] | None = None
        self._beat_failed = ""
        self._damage_checked = float("-inf")

    def _make_loop(self, inventory: Inventory) -> SchedulingLoop:
        """Node connections and the scheduling loop (paramiko and numpy load only here)."""
        from .round.loop import SchedulingLoop

        loop = SchedulingLoop(self.store, inventory, self._pool(inventory), self.scripts_dir,
                              self.clock)
        loop.foresight.start()   # the forecast thread; the loop's close() stops it
        return loop

    # ------------------------------------------------------------------ the service's port
    def wake(self) -> None:
        """Start the next round now (``requests/port.ControllerPort``)."""
        self._wake.set()

    def degraded(self) -> IadeepError | None:
        return self._degraded

    def nodes(self) -> NodeWork | None:
        """The round's nodes for the service (logs, keystrokes, fencing); None without a loop."""
        return _LoopNodes(self.loop) if self.loop is not None else None

    def heard(self, job_id: int, now: float) -> None:
        """An interactive job's owner was heard from: noted where the round's limits step reads
        it (``controller/presence.py``)."""
        if self.loop is not None:
            self.loop.ctx.presence.heard(job_id, now)

    def forecasts(self) -> Foresight | None:
        """The round's forecasts for the service to read (``controller/foresight.py``); None
        without a loop (no nodes: nothing to forecast)."""
        return self.loop.foresight if self.loop is not None else None

    def _pool(self, inventory: Inventory) -> Pool:
        from ..nodes.poller import NodePool

        for node in inventory.nodes:
            if node.local:
                log.warning("node %s is local: its jobs run as the controller's own account and "
                            "could change its state; see docs/security.md", node.name)
        # A node that stopped answering is retried at least once per grace period, and a hung
        # nvidia-smi gives up well inside it, so that its node, which still answers, is never
        # taken for a silent one.
        grace = inventory.node_grace_s
        # A backend whose pool polls its nodes itself (``Features.polls_itself``) answers for
        # them; the rest go over SSH: the SSH nodes, and such nodes read over SSH for their
        # GPUs' telemetry.
        polled = tuple(n for n in inventory.nodes
                       if not features(n.backend).polls_itself or n.ssh_telemetry)
        ssh = inventory if len(polled) == len(inventory.nodes) else dataclasses.replace(
            inventory, nodes=polled)
        pool = NodePool(_scoped_workdirs(ssh, self.install_id, dir_names(self.store)),
                        backoff_max=min(60.0, max(5.0, grace)),
                        gpu_timeout=min(10.0, max(1.0, grace / 4)))
        from ..nodes.pools import with_backends
        return with_backends(inventory, pool, self.install_id, self._attempts)

    def _attempts(self, ids) -> dict[int, int]:
        """Each job's current attempt: how a batch system's backend names its job there."""
        from ..store import jobrows
        with self.store.tx() as conn:
            return {j.id: j.attempts for j in (jobrows.get(conn, i) for i in ids)}

    def _notice_log(self, job, offset: int, max_bytes: int) -> tuple[str, int, int | None]:
        """The notifier's way to a job's log: through the node pool of the moment."""
        if self.loop is None:
            raise NodeError("this controller has no node connections",
                            hint="the job's log stays on its node")
        return _LoopNodes(self.loop).read_log(job, offset, max_bytes, "output")

    # ------------------------------------------------------------------ reload
    def reload(self) -> m.ReloadResult:
        """Re-read the inventory file this controller was started with (`controller reload`).

        The file is validated here, so a bad one raises its file:line error and changes
        nothing; the main thread swaps a good one in between two rounds (no round sees half of
        each). Returns what changed, or ``pending`` if the current round outlasts RELOAD_WAIT_S.
        """
        new = self._read_inventory()
        done: Future = Future()
        with self._reloads_lock:
            self._reloads.append((new, done))
        self._wake.set()
        try:
            return done.result(timeout=RELOAD_WAIT_S)
        except FutureTimeout:
            return m.ReloadResult(str(new.path), pending=True)

    def hangup(self, *_args) -> None:
        """SIGHUP: only note it; the main loop reloads between rounds (a signal handler runs in
        the middle of whatever the main thread was doing, a round included)."""
        self._hangup = True
        self._wake.set()

    def _read_inventory(self) -> Inventory:
        if self.inventory.path is None:
            raise ConfigError("this controller was started without an inventory file",
                              hint="restart it with `iadeep controller run --inventory FILE`")
        return load_inventory(self.inventory.path)

    def _apply_reloads(self) -> None:
        with self._reloads_lock:
            pending, self._reloads = self._reloads, []
        if self._hangup:
            self._hangup = False
            try:
                pending.append((self._read_inventory(), None))
            except IadeepError as exc:
                log.error("reload on SIGHUP refused, the running configuration stays: %s",
                          exc.message)
        for new, done in pending:
            try:
                result = self._use(new)
            except Exception as exc:   # e.g. an unreadable ~/.ssh/config: keep the old nodes
                log.exception("reload of %s failed; the running configuration stays", new.path)
                if done is not None:
                    done.set_exception(exc)
                continue
            if done is not None:
                done.set_result(result)

    def _use(self, new: Inventory) -> m.ReloadResult:
        """Swap in a validated inventory: lab settings, policy, admins and limits at once, and a
        new node pool (connections to removed nodes close with the old one). Running jobs keep
        running; those on a node no longer listed are the loop's to handle (lost)."""
        new = _with_backend_nodes(new)
        old = self.inventory
        renames = renamed(old, new)   # a renamed node's jobs follow it (controller/renames.py)
        carry(self.store, renames, self.clock)
        if self.loop is not None:
            old_pool = self.loop.pool
            self.loop.use(new, self._pool(new))
            old_pool.close()
        elif new.nodes:
            self.loop = self._make_loop(new)
        self.inventory = new
        self.service.use(new)
        self.notifier.use(new.notify)
        if new.metrics != old.metrics:
            log.warning("lab.metrics changed in %s: it applies at the controller's next start",
                        new.path)
        names = [n.name for n in new.nodes]
        change = {"renamed": tuple(f"{a} to {b}" for a, b in renames.items()),
                  "added": tuple(n for n in names if old.node(n) is None
                                 and n not in renames.values()),
                  "removed": tuple(n.name for n in old.nodes if new.node(n.name) is None
                                   and n.name not in renames),
                  "changed": tuple(n for n in names if old.node(n) is not None
                                   and old.node(n) != new.node(n))}
        summary = (f"{len(names)} node{'' if len(names) == 1 else 's'} ("
                   + ("; ".join(f"{k} {', '.join(v)}" for k, v in change.items() if v)
                      or "no node changed") + ")")
        log.info("reloaded %s: %s", new.path, summary)
        return m.ReloadResult(str(new.path), nodes=tuple(names), summary=summary,
                              added=change["added"], removed=change["removed"],
                              changed=change["changed"])

    def heartbeat(self, stopped_at: float | None = None) -> None:
        """Record that we live (and publish the views), or degrade if the state directory
        cannot take it; never raises for a sick state directory."""
        lost = self.store.identity_problem()
        problem = lost or self._damage() or statedir.room_problem(self.state.root)
        if lost is None:
            try:
                now = self.clock()
                with self.store.tx() as conn:
                    cluster.set_meta(conn, "controller", m.ControllerView(
                        pid=os.getpid(), started_at=self.started_at, heartbeat_at=now,
                        poll_interval_s=self.inventory.poll_interval_s,
                        aging_per_hour=self.inventory.policy.aging_per_hour,
                        nodes=tuple(n.name for n in self.inventory.nodes),
                        degraded=problem, stopped_at=stopped_at,
                        rounds_failing=self.rounds_failing()).to_dict())
                self._publish(now, force=stopped_at is not None)
            except StoreError as exc:
                problem = problem or exc
            except sqlite3.DatabaseError as exc:
                if not is_damage(exc):
                    raise
                self._damage_checked = float("-inf")
                problem = problem or self._damage() or StoreError(str(exc))
        self._degrade(problem, lost)

    def _damage(self) -> StoreError | None:
        """The database found damaged on disk, checked every ``DAMAGE_CHECK_POLLS`` poll
        intervals (at most every 5 min) and at once after an error that said so."""
        every = min(300.0, DAMAGE_CHECK_POLLS * self.inventory.poll_interval_s)
        if self.store.damaged is None and time.monotonic() - self._damage_checked >= every:
            self._damage_checked = time.monotonic()
            self.store.check_damage()
        return self.store.damaged

    def _publish(self, now: float, force: bool) -> None:
        if not force and now - self._published_at < PUBLISH_EVERY_S:
            return
        with self.store.tx() as conn:
            data = offline.public_views(conn, now)
        try:
            offline.publish(self.state, data)
            self._published_at = now
        except OSError as exc:   # a full disk: readers keep the older snapshot
            log.debug("public snapshot not written: %s", exc)

    def _degrade(self, problem: IadeepError | None, lost: IadeepError | None) -> None:
        """Refuse new jobs while ``problem`` lasts, logged when it starts and ends. A lost
        database is also copied out, from the connection that still reads it."""
        before = self._degraded
        if (problem and problem.message) != (before and before.message):
            if problem is None:
                log.warning("state directory healthy again; accepting new jobs")
            else:
                log.error("%s (hint: %s)", problem.message, problem.hint)
        self._degraded = problem
        if lost is not None and not self._rescued:
            try:
                target = self.store.rescue()
            except Exception as exc:   # sqlite3.Error, OSError (full disk): next heartbeat
                if str(exc) != self._rescue_failed:
                    log.error("could not save a copy of the database yet: %s", exc)
                self._rescue_failed = str(exc)
            else:
                self._rescued = True
                log.error("saved what the controller held to %s", target)

    def _serve_metrics(self) -> None:
        """Start the Prometheus endpoint if asked; a bad address (in use, not this machine's)
        stops the start with its one-line error, before anything runs."""
        if self._metrics_at is None:
            return
        from .requests.metrics import serve

        try:
            self.metrics = serve(self._metrics_at, self.store.path, lambda: self.inventory,
                                 lambda: self._degraded is not None, self.started_at,
                                 self.clock)
        except BaseException:
            self.socket.close()
            self.store.close()
            raise
        log.info("serving Prometheus metrics on %s", self.metrics.url)

    def run(self, on_ready: Callable[[], None] = lambda: None) -> None:
        """Serve until stop(); each tick runs one scheduling round (if a loop is attached)."""
        self._serve_metrics()
        self.socket.start()
        self.notifier.start()
        self.heartbeat()
        log.info("controller started (pid %d): inventory %s, %s; listening on %s",
                 os.getpid(), self.inventory.path,
                 f"nodes {', '.join(n.name for n in self.inventory.nodes)}"
                 if self.inventory.nodes else "no nodes", self.socket.path)
        on_ready()
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                self._apply_reloads()
                if self.loop is not None and self.store.identity_problem() is None:
                    round_began = time.monotonic()
                    self._tick()
                    self._free_copies()   # finished jobs' script copies past their retention
                    if self.metrics is not None:
                        self.metrics.round_done(time.monotonic() - round_began, self.clock())
                self.notifier.wake()   # jobs that ended in this round, or by a request
                self._beat()
                self._round_done()
                # a fixed rate: a round that took long does not also delay the next one
                self._wake.wait(max(0.0, self.inventory.poll_interval_s -
                                    (time.monotonic() - began)))
                self._wake.clear()
        finally:
            log.info("controller stopping (%s); running jobs keep running on their nodes",
                     self._stopped_by)
            self.socket.close()
            if self.metrics is not None:
                self.metrics.close()
            self.notifier.close()
            self.heartbeat(stopped_at=self.clock())
            if self.loop is not None:
                self.loop.close()
            self.store.close()
            log.info("controller stopped")

    def _free_copies(self) -> None:
        now = self.clock()
        if now - self._copies_freed_at < FREE_EVERY_S:
            return
        self._copies_freed_at = now
        try:
            free_copies(self.store, self.scripts_dir, self.inventory.job_dir_retention_s, now,
                        int(self.inventory.script_copies_gib * 2**30))
        except Exception as exc:   # never the controller's end (the heartbeat reports a sick
            log.warning("freeing script copies: %s",   # state directory)
                        getattr(exc, "message", None) or exc)

    def _beat(self) -> None:
        """The heartbeat between rounds; an error it did not expect (no file descriptor left:
        EMFILE from SQLite or a file) is logged once and tried again next round, never allowed
        to end the controller."""
        try:
            self.heartbeat()
        except Exception as exc:
            if str(exc) != self._beat_failed:
                log.error("heartbeat not recorded: %s: %s; trying again next round",
                          type(exc).__name__, exc)
            self._beat_failed = str(exc)
            return
        if self._beat_failed:
            log.warning("heartbeat recorded again")
            self._beat_failed = ""

    def _tick(self) -> None:
        """One round; a bug in one round is logged, not allowed to stop the controller. A
        round that cannot write (full disk) is logged once, and again when rounds resume."""
        assert self.loop is not None   # called only with one
        try:
            self.loop.tick()
        except StoreError as exc:
            if exc.message != self._round_stopped:
                log.warning("scheduling round stopped: %s", exc.message)
            self._round_stopped = exc.message
            return
        except Exception as exc:
            if is_damage(exc):   # checked at this heartbeat
                self._damage_checked = float("-inf")
            log.exception("scheduling round failed; retrying next interval")
            self._round_failed(exc)
            return
        if self._round_stopped:
            log.warning("scheduling rounds complete again")
            self._round_stopped = None
        if self._rounds_failing is not None:
            log.warning("scheduling rounds complete again after %d failed",
                        self._rounds_failing[1])
            self._rounds_failing = None

    def _round_failed(self, exc: Exception) -> None:
        """A round failed: counted (the metrics), and shown by `iadeep status` while rounds go
        on failing (``rounds_failing``)."""
        first, count, _ = self._rounds_failing or (self.clock(), 0, "")
        self._rounds_failing = (first, count + 1, f"{type(exc).__name__}: {exc}"[:300])
        if self.metrics is not None:
            self.metrics.round_failed()

    def rounds_failing(self) -> str | None:
        """What `iadeep status` shows while scheduling rounds fail one after another, else
        None: nothing is placed or started meanwhile."""
        if self._rounds_failing is None:
            return None
        first, count, error = self._rounds_failing
        return (f"scheduling rounds failing: the last {count} failed, since "
                f"{time.strftime('%H:%M:%S', time.localtime(first))} ({error}); nothing is "
                "placed or started meanwhile")

    def stop(self, signum: int | None = None, _frame=None) -> None:
        if signum is not None:
            self._stopped_by = signal.Signals(signum).name
        self._stop.set()
        self._wake.set()


@dataclasses.dataclass(frozen=True)
class _LoopNodes:
    """The round's nodes as the service reaches them (``requests/port.NodeWork``): each job's
    node's backend from the loop's pool of the moment (a reload may have replaced it)."""

    loop: SchedulingLoop

    def read_log(self, job: Job, offset: int, max_bytes: int, stream: str
                 ) -> tuple[str, int, int | None]:
        return self.loop.pool.backend(job.node or "").read_log(
            job.id, offset, max_bytes, owner=job.owner, job=job, stream=stream).text()

    def write_input(self, job: Job, data: bytes) -> None:
        """A --pty job's keystrokes, through its node's backend (requests/interactive.py)."""
        self.loop.pool.backend(job.node or "").write_input(job, data)

    def fence(self, node: str, by: str) -> list[int]:
        return self.loop.fence(node, by)


def _with_backend_nodes(inventory: Inventory) -> Inventory:
    """The inventory with the nodes its batch systems list (``nodes.pools``), as they have them
    at start and at each reload."""
    from ..nodes.pools import with_backend_nodes
    return with_backend_nodes(inventory)


def _scoped_workdirs(inventory: Inventory, install_id: str,
                     dirs: dict[str, str] | None = None) -> Inventory:
    """Job directories live under WORKDIR/<install id>/<node>/jobs/<job id>:
    - the install id: job ids restart at 1 with a new database, and a new controller must never
      mistake an old job's directory (pid file, exit code) for its own job's;
    - the node name: labs often share home directories over NFS, and a job retried on another
      node must not find its first attempt's directory there.
    On a ``run_as: submitter`` node the same ``<install id>/<node>`` (``Node.scope``) is under
    each user's own ``~/.iadeep/``. A renamed node keeps its first name there (``dirs``: name ->
    that name; see controller/renames.py), so its jobs' directories stay where they are."""
    dirs = dirs or {}
    nodes = tuple(dataclasses.replace(
        n, workdir=f"{n.workdir.rstrip('/')}/{install_id}/{dirs.get(n.name, n.name)}",
        scope=f"{install_id}/{dirs.get(n.name, n.name)}") for n in inventory.nodes)
    return dataclasses.replace(inventory, nodes=nodes)


def run_forever(inventory: Inventory, on_ready: Callable[[], None] = lambda: None,
                new_database: bool = False, metrics: tuple[str, int] | None = None) -> None:
    systemd = SystemdNotifier()   # Type=notify and WatchdogSec (deploy/), when under systemd
    if systemd.watchdog_s is not None and systemd.watchdog_s < 2 * inventory.poll_interval_s:
        log.warning("systemd's watchdog (%gs) is under twice the poll interval (%gs): a slow "
                    "round would have the controller restarted; raise WatchdogSec",
                    systemd.watchdog_s, inventory.poll_interval_s)
    controller = Controller(inventory, new_database=new_database, metrics=metrics,
                            round_done=systemd.round_done)
    signal.signal(signal.SIGTERM, controller.stop)
    signal.signal(signal.SIGINT, controller.stop)
    signal.signal(signal.SIGHUP, controller.hangup)

    def ready() -> None:
        systemd.ready(f"serving {controller.socket.path}")
        on_ready()
    try:
        controller.run(ready)
    finally:
        systemd.stopping()

"""Prometheus metrics for the lab's monitoring (``iadeep controller run --metrics HOST:PORT``).

Why it is built this way:

- **Read at scrape time, not pushed from the loop.** ``LabCollector`` is a custom collector: a
  scrape reads the recorded state once and builds every series from it, so all series of one
  scrape describe the same instant, and the scheduling loop does no work for metrics beyond
  timing its round (``MetricsServer.round_done``).
- **Never in the loop's way.** The collector reads through its *own* read-only SQLite
  connection, inside one read transaction: it never takes the writer's ``Store`` lock, and in
  WAL mode a reader neither blocks nor is blocked by the writer. The HTTP server runs on its own
  threads (``prometheus_client``'s). benchmarks/bench_metrics.py measures a round with metrics
  off, on, and on while scraped continuously.
- **The same numbers as ``iadeep status``.** Nodes, GPUs, jobs on them and the count per state
  come from ``views.status_view``, the function that answers ``status --json``.
- **Bounded like the socket.** Anyone who can reach the port can connect, so at most
  ``METRICS_CONNECTIONS`` are open at once: a new one beyond that closes the oldest that has
  not sent its request yet (else the oldest), so idle connections cannot keep a scrape out (a
  cap per peer address did not: on loopback any account chooses its source address among
  127.0.0.0/8); one that sends or reads nothing for ``METRICS_IDLE_S`` is closed, and an accept
  that fails for want of descriptors waits a moment instead of spinning (before, ~1,000 idle
  connections took the controller to its 1,024 open files and ended it).
- **Loaded only when asked for.** This module imports ``prometheus_client``; the runtime imports
  it only when metrics are on, so a controller without them (and every client) never loads it.

Series (docs/accounting.md lists them for Grafana): ``iadeep_`` first, base units (bytes, seconds,
watts, ratios 0..1) and the unit in the name, as Prometheus' naming conventions ask. GPU
readings (utilisation, memory, power, temperature) are exported only while their node's data
is fresh (node state ``up``): a down node's last reading is history, not the present.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ...errors import ConfigError
from ...messages import ImpactView, NodeState, StatusView
from ...settings import Inventory
from ...snapshot import GpuSample
from ...store import Store, cluster
from .. import jobfault
from . import views

log = logging.getLogger("iadeep.controller")
MIB = 1024 * 1024
# Queue waits run from seconds (an idle lab) to days (a full one).
WAIT_BUCKETS = (10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0,
                12 * 3600.0, 86400.0, 2 * 86400.0, 7 * 86400.0)
# A round is about one poll (its wait is capped at one poll interval, 10 s at most).
# The help text of a GPU-hour gauge kept for dashboards not yet moved to its seconds twin
# (Prometheus's rule: base units; `promtool check metrics` flags hours)
LEGACY = "Deprecated (lab.metrics.legacy_hours), use the *_gpu_seconds twin. "
ROUND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A fresh node's GPU series, one a field of its sample: (name, help, the value in base units;
# None: not read, no series). Labelled node and gpu.
GPU_SERIES: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("iadeep_gpu_utilization_ratio", "GPU utilisation (0..1), nvidia-smi utilization.gpu.",
     lambda g: _scaled(g.utilization_gpu, 0.01)),
    ("iadeep_gpu_memory_used_bytes", "GPU memory in use.",
     lambda g: _scaled(g.memory_used_mib, MIB)),
    ("iadeep_gpu_memory_total_bytes", "GPU memory in all.",
     lambda g: _scaled(g.memory_total_mib, MIB)),
    ("iadeep_gpu_power_draw_watts", "Board power draw.", lambda g: g.power_draw_w),
    ("iadeep_gpu_power_limit_watts", "Board power limit.", lambda g: g.power_limit_w),
    ("iadeep_gpu_temperature_celsius", "GPU temperature.", lambda g: g.temperature_c),
)
# The impact factor and its parts per window (docs/accounting.md): (name, help, the value of
# a window; None: no series, legacy: a GPU-hour twin, only with lab.metrics.legacy_hours).
IMPACT_SERIES: tuple[tuple[str, str, Callable[[ImpactView], float | None], bool], ...] = (
    ("iadeep_impact_factor", "Work done in exclusive-GPU-hours per busy GPU-hour (1.00: as "
     "one job per GPU).", lambda w: w.impact_factor, False),
    ("iadeep_work_gpu_seconds", "Work done in exclusive-GPU-seconds.",
     lambda w: w.work_gpu_hours * 3600.0, False),
    ("iadeep_busy_gpu_seconds", "GPU-seconds the busy GPUs were busy.",
     lambda w: w.busy_gpu_hours * 3600.0, False),
    ("iadeep_work_measured_ratio", "Share of the work from observed speeds rather than "
     "predicted ones.", lambda w: w.measured_share, False),
    ("iadeep_work_gpu_hours", "Work done in exclusive-GPU-hours.", lambda w: w.work_gpu_hours,
     True),
    ("iadeep_busy_gpu_hours", "GPU-hours the busy GPUs were busy.", lambda w: w.busy_gpu_hours,
     True),
)


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale

# The first start of each job since the cursor (a requeued job's wait ends at its first start,
# as in `iadeep report`); events are written by one connection, so ids commit in order.
_FIRST_STARTS = """
SELECT e.id, e.at - j.submitted_at AS wait_s FROM events e JOIN jobs j ON j.id = e.job_id
WHERE e.id > ? AND e.new_state = 'starting' AND NOT EXISTS (
    SELECT 1 FROM events p WHERE p.job_id = e.job_id AND p.new_state = 'starting'
    AND p.id < e.id)
ORDER BY e.id
"""


class LabCollector(Collector):
    """Every ``iadeep_*`` series, built at scrape time from the recorded state.

    ``inventory``: the controller's inventory of the moment (a reload replaces it);
    ``degraded``: whether the controller refuses new jobs now."""

    def __init__(self, db_path: Path, inventory: Callable[[], Inventory],
                 degraded: Callable[[], bool], started_at: float,
                 clock: Callable[[], float] = time.time):
        self._store = Store(db_path, readonly=True)   # its own connection and lock
        self._inventory = inventory
        self._degraded = degraded
        self._started_at = started_at
        self._clock = clock
        self._lock = threading.Lock()   # the HTTP server answers each scrape on its own thread
        # Queue waits of the jobs first started since this collector began (a Prometheus
        # histogram counts from the process's start; rate() copes with the restart).
        with self._store.tx() as conn:
            self._cursor = conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
        self._wait_counts = [0] * (len(WAIT_BUCKETS) + 1)   # the last: above every bound
        self._wait_sum = 0.0

    def close(self) -> None:
        with self._lock:
            self._store.close()

    @property
    def _legacy_hours(self) -> bool:
        """Whether the lab still wants the GPU-hour gauges (lab.metrics.legacy_hours)."""
        return self._inventory().metrics.legacy_hours

    def collect(self) -> Iterator[Metric]:
        with self._lock, self._store.tx() as conn:
            conn.execute("BEGIN")   # one read snapshot for every series of this scrape
            try:
                now = self._clock()
                view = views.status_view(conn, now, self._inventory())
                idle_s = cluster.get_meta(conn, cluster.IDLE_GPU_SECONDS, {})   # steps/idle.py
                for _id, wait_s in self._new_waits(conn):
                    self._observe_wait(max(0.0, wait_s))
            finally:
                conn.rollback()
            yield from self._controller(view)
            yield from self._nodes(view)
            yield from self._gpus_and_jobs(view)
            yield self._jobs_by_state(view)
            yield from self._impact(view)
            yield self._queue_wait()
            yield from self._idle(idle_s)

    def _idle(self, idle_s: dict[str, float]) -> Iterator[Metric]:
        help_ = ("{unit} each user's running jobs held with their GPUs idle (lab.idle_util or "
                 "below), since the database began.")
        family = GaugeMetricFamily("iadeep_idle_gpu_seconds", help_.format(unit="GPU-seconds"),
                                   labels=["user"])
        legacy = GaugeMetricFamily("iadeep_idle_gpu_hours", LEGACY
                                   + help_.format(unit="GPU-hours"), labels=["user"])
        for user, seconds in sorted(idle_s.items()):
            family.add_metric([user], seconds)
            legacy.add_metric([user], seconds / 3600.0)
        yield family
        if self._legacy_hours:
            yield legacy

    # ------------------------------------------------------------------ the series
    def _controller(self, view: StatusView) -> Iterator[Metric]:
        yield GaugeMetricFamily("iadeep_controller_start_time_seconds",
                                "When this controller started (Unix time).",
                                value=self._started_at)
        yield GaugeMetricFamily("iadeep_controller_degraded",
                                "1 while the controller refuses new jobs (its state directory "
                                "is full, or its database was replaced), else 0.",
                                value=1.0 if self._degraded() else 0.0)

    def _nodes(self, view: StatusView) -> Iterator[Metric]:
        up = GaugeMetricFamily("iadeep_node_up", "1 if the node's data is fresh and it "
                               "answered its last poll (iadeep status: up), else 0.",
                               labels=["node"])
        state = GaugeMetricFamily("iadeep_node_state", "1 for the node's state in iadeep "
                                  "status (up, down, stale, removed), 0 for the others.",
                                  labels=["node", "state"])
        reachable = GaugeMetricFamily("iadeep_node_reachable", "1 if the node answered its "
                                      "last poll over SSH (its jobs are tracked), even when its "
                                      "GPUs could not be read; 0 while it is silent.",
                                      labels=["node"])
        age = GaugeMetricFamily("iadeep_node_data_age_seconds", "How old the node's last GPU "
                                "data is.", labels=["node"])
        rtt = GaugeMetricFamily("iadeep_node_poll_rtt_seconds", "Round trip of the node's "
                                "last answered poll.", labels=["node"])
        for node in view.nodes:
            name = node.name
            up.add_metric([name], 1.0 if node.state == NodeState.UP else 0.0)
            for s in NodeState:
                state.add_metric([name, s.value], 1.0 if node.state == s else 0.0)
            reachable.add_metric([name], 1.0 if node.down_since is None else 0.0)
            age.add_metric([name], node.age_s)
            if node.snapshot.rtt_s is not None:
                rtt.add_metric([name], node.snapshot.rtt_s)
        yield from (up, state, reachable, age, rtt)

    def _gpus_and_jobs(self, view: StatusView) -> Iterator[Metric]:
        labels = ["node", "gpu"]
        info = GaugeMetricFamily("iadeep_gpu_info", "1 for each GPU the controller knows, with "
                                 "its model and UUID.", labels=[*labels, "model", "uuid"])
        sampled = [(GaugeMetricFamily(name, help_, labels=labels), read)
                   for name, help_, read in GPU_SERIES]
        foreign = GaugeMetricFamily("iadeep_gpu_foreign_processes", "Compute processes on the "
                                    "GPU that iadeep did not start.", labels=labels)
        jobs = GaugeMetricFamily("iadeep_gpu_jobs", "iadeep jobs placed on the GPU (starting "
                                 "or running).", labels=labels)
        job_labels = ["job", "user", "name", "node", "gpus"]
        predicted = GaugeMetricFamily("iadeep_job_predicted_speed_ratio", "A placed job's "
                                      "predicted speed relative to running alone (1 = as fast "
                                      "as alone).", labels=job_labels)
        observed = GaugeMetricFamily("iadeep_job_observed_speed_ratio", "A placed job's observed "
                                     "speed relative to running alone, where it is measured.",
                                     labels=job_labels)
        placed: dict[int, tuple] = {}   # job id -> (GpuJob, node, GPU indices)
        for node in view.nodes:
            fresh = node.state == NodeState.UP
            for gv in node.gpus:
                g = gv.sample
                key = [node.name, str(g.index)]
                info.add_metric([*key, g.name, g.uuid], 1.0)
                jobs.add_metric(key, float(len(gv.jobs)))
                for job in gv.jobs:
                    _, _, indices = placed.setdefault(job.id, (job, node.name, []))
                    indices.append(g.index)
                if not fresh:
                    continue
                for family, read in sampled:
                    value = read(g)
                    if value is not None:
                        family.add_metric(key, value)
                foreign.add_metric(key, float(len(g.foreign_processes)))
        for job_id, (job, node_name, indices) in sorted(placed.items()):
            key = [str(job_id), job.owner, job.name, node_name, ",".join(map(str, indices))]
            if job.predicted_speed is not None:
                predicted.add_metric(key, job.predicted_speed)
            if job.observed_speed is not None:
                observed.add_metric(key, job.observed_speed)
        yield from (info, *(family for family, _ in sampled), foreign, jobs, predicted,
                    observed)

    def _jobs_by_state(self, view: StatusView) -> Metric:
        family = GaugeMetricFamily("iadeep_jobs", "Jobs in the controller's database by state "
                                   "(the counts of iadeep status --json).", labels=["state"])
        for state, count in view.queue.items():
            family.add_metric([state.value], float(count))
        return family

    def _impact(self, view: StatusView) -> Iterator[Metric]:
        """The impact factor and its parts (docs/accounting.md "The impact factor"), as `status`
        shows them: window="1h" the last hour, window="start" since the controller started. A window
        in which no GPU was busy has no impact factor, so that series is left out, not 0."""
        for name, help_, read, legacy in IMPACT_SERIES:
            if legacy and not self._legacy_hours:
                continue
            family = GaugeMetricFamily(name, LEGACY + help_ if legacy else help_,
                                       labels=["window"])
            for label, w in (("1h", view.impact_last_hour), ("start", view.impact_since_start)):
                value = None if w is None else read(w)
                if value is not None:
                    family.add_metric([label], value)
            yield family

    # ------------------------------------------------------------------ queue wait
    def _new_waits(self, conn) -> list[tuple[int, float]]:
        rows = [(r[0], float(r[1])) for r in conn.execute(_FIRST_STARTS, (self._cursor,))]
        if rows:
            self._cursor = rows[-1][0]
        return rows

    def _observe_wait(self, wait_s: float) -> None:
        i = next((i for i, bound in enumerate(WAIT_BUCKETS) if wait_s <= bound),
                 len(WAIT_BUCKETS))
        self._wait_counts[i] += 1
        self._wait_sum += wait_s

    def _queue_wait(self) -> Metric:
        cumulative, buckets = 0, []
        for bound, count in zip((*map(floatToGoString, WAIT_BUCKETS), "+Inf"),
                                self._wait_counts):
            cumulative += count
            buckets.append((bound, cumulative))
        return HistogramMetricFamily(
            "iadeep_queue_wait_seconds", "From submission to a job's first start, for the jobs "
            "first started since the controller started.", buckets=buckets,
            sum_value=self._wait_sum)


METRICS_CONNECTIONS = 16    # open at once; one more closes the oldest still without a request
METRICS_IDLE_S = 10.0       # a connection that sends (or reads) nothing this long is closed
_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class _QuietHandler(WSGIRequestHandler):
    def setup(self) -> None:
        super().setup()
        self.answering = False    # True once its request has arrived whole
        if isinstance(self.server, _CappedServer):
            self.server.track(self)

    def parse_request(self) -> bool:
        self.answering = True
        return super().parse_request()

    def log_message(self, format, *args):
        """A scrape is not worth a log line."""


class _CappedServer(ThreadingMixIn, WSGIServer):
    """prometheus_client's threaded WSGI server, with the caps above."""

    daemon_threads = True
    request_queue_size = 128   # socketserver's 5 makes a burst of connects wait for SYN retries
    total = METRICS_CONNECTIONS
    idle_s = METRICS_IDLE_S

    def server_activate(self) -> None:
        self._open: dict[socket.socket, float] = {}     # connection -> when accepted
        self._handlers: dict[socket.socket, _QuietHandler] = {}
        self._count_lock = threading.Lock()
        self._warned_at: dict[str, float] = {}
        super().server_activate()

    def _warn(self, key: str, message: str) -> None:
        now = time.monotonic()
        if now - self._warned_at.get(key, -60.0) >= 60.0:   # a flood must not flood the log
            self._warned_at[key] = now
            log.warning("metrics: %s", message)

    def get_request(self):
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in _NO_DESCRIPTORS:   # wait for some to be freed; never spin
                self._warn("accept", f"cannot accept a connection: {exc}")
                time.sleep(0.1)
            raise

    def verify_request(self, request, client_address) -> bool:
        """Always admitted: at the cap, the oldest connection without a request yet (else the
        oldest) is closed for it, whatever address either comes from."""
        with self._count_lock:
            evicted = 0
            while len(self._open) >= self.total:
                self._evict()
                evicted += 1
            self._open[request] = time.monotonic()
        if evicted:
            self._warn("cap", f"{self.total} connections open: closing the oldest idle one "
                       "for each new one")
        request.settimeout(self.idle_s)
        return True

    def _evict(self) -> None:
        waiting = [c for c in self._open
                   if not getattr(self._handlers.get(c), "answering", False)]
        oldest = min(waiting or self._open, key=self._open.__getitem__)
        del self._open[oldest]
        try:
            oldest.shutdown(socket.SHUT_RDWR)   # its thread's read ends; it closes it
        except OSError:
            pass

    def track(self, handler: _QuietHandler) -> None:
        with self._count_lock:
            if handler.request in self._open:
                self._handlers[handler.request] = handler

    def _release(self, request) -> None:
        with self._count_lock:
            self._open.pop(request, None)
            self._handlers.pop(request, None)

    def process_request(self, request, client_address) -> None:
        try:
            super().process_request(request, client_address)
        except RuntimeError:   # no thread to be had
            self.shutdown_request(request)
            self._release(request)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def handle_error(self, request, client_address) -> None:
        """An idle or vanished client (its timeout, a reset): closed, not a traceback."""
        log.debug("metrics: connection from %s ended badly", client_address, exc_info=True)


def _start_server(host: str, port: int, registry: CollectorRegistry
                  ) -> tuple[_CappedServer, threading.Thread]:
    family, _, _, _, sockaddr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                    flags=socket.AI_PASSIVE)[0]

    class Server(_CappedServer):
        address_family = family

    httpd = make_server(str(sockaddr[0]), port, make_wsgi_app(registry), Server,
                        handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="iadeep-metrics", daemon=True)
    thread.start()
    return httpd, thread


class MetricsServer:
    """The HTTP endpoint (``/metrics``, any path answers the same) and the round timer."""

    def __init__(self, address: tuple[str, int], collector: LabCollector):
        self.registry = CollectorRegistry()
        self.collector = collector
        self.registry.register(collector)
        ProcessCollector(registry=self.registry)   # the controller's CPU and memory
        self.rounds = Histogram("iadeep_round_duration_seconds", "How long a scheduling round "
                                "took (poll every node, reconcile, decide, start).",
                                buckets=ROUND_BUCKETS, registry=self.registry)
        self._last_round = _LastRound(self.registry)
        self.failed_rounds = Counter("iadeep_rounds_failed", "Scheduling rounds that failed "
                                     "(an error the round did not expect: see the controller's "
                                     "log; iadeep status says DEGRADED while they fail).",
                                     registry=self.registry)
        _JobDataFaults(self.registry)
        host, port = address
        shown = f"[{host}]:{port}" if ":" in host else f"{host or '*'}:{port}"
        try:
            self._httpd, self._thread = _start_server(host, port, self.registry)
        except OSError as exc:
            collector.close()
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"metrics address {shown} is already in use",
                                  hint="another program (another controller's metrics?) "
                                       "listens there: choose another port with --metrics or "
                                       "lab.metrics.listen") from None
            reason = exc.strerror if not isinstance(exc, socket.gaierror) else \
                f"unknown host ({exc.strerror})"
            raise ConfigError(f"cannot serve metrics on {shown}: {reason}",
                              hint="give an address of this machine, e.g. 127.0.0.1:9464") \
                from None
        bound = self._httpd.server_address
        where = bound[0] if isinstance(bound[0], str) else bound[0].decode()
        self.port: int = int(bound[1])
        self.url = (f"http://[{where}]:{self.port}/metrics" if ":" in where
                    else f"http://{where}:{self.port}/metrics")

    def round_done(self, seconds: float, at: float) -> None:
        """The loop's one call: a round took ``seconds`` and ended at ``at`` (Unix time)."""
        self.rounds.observe(seconds)
        self._last_round.at = at

    def round_failed(self) -> None:
        """A round that failed (``runtime.Controller._tick``)."""
        self.failed_rounds.inc()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self.collector.close()


class _LastRound(Collector):
    """When the last round ended: an alert on "now - this" catches a stuck loop."""

    def __init__(self, registry: CollectorRegistry):
        self.at: float | None = None
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        if self.at is not None:
            yield GaugeMetricFamily("iadeep_round_last_end_time_seconds", "When the last "
                                    "scheduling round ended (Unix time).", value=self.at)


class _JobDataFaults(Collector):
    """How often a step skipped one job's part because of what the job wrote
    (``controller/jobfault.py``): the round went on."""

    def __init__(self, registry: CollectorRegistry):
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("iadeep_job_data_faults", "Times a round skipped one job's "
                                  "measurement (its speed, its failure's name) because of what "
                                  "the job wrote; the round went on.",
                                  value=jobfault.FAULTS.count)


def serve(address: tuple[str, int], db_path: Path, inventory: Callable[[], Inventory],
          degraded: Callable[[], bool], started_at: float,
          clock: Callable[[], float] = time.time) -> MetricsServer:
    """Start serving; a one-line ConfigError if the address cannot be bound."""
    collector = LabCollector(db_path, inventory, degraded, started_at, clock)
    return MetricsServer(address, collector)

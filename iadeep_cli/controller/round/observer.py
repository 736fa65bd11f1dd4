"""Online learning: how fast jobs really run, alone and side by side.

A job that reports progress (``IADEEP_PROGRESS_FILE``) gives its iterations/s. Its rate while
it runs alone on its GPU is its solo rate; its rate while sharing, divided by that, is its
observed speed (the same definition as pairs.csv). When both jobs on a shared GPU have an
observed speed, the pair becomes a co-location row in the store, and the model is refitted in
the background on a schedule, so the lab's own measurements gradually replace the shipped ones.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...errors import IadeepError
from ...jobs import Job
from ...nodes.connection import Pool
from ...profiles import CoLocation, measurable
from ...progress import parse_progress, parse_total, rate
from ...scheduler.detectors import SPEED_CAP
from ...snapshot import ClusterSnapshot
from ..jobfault import guarded

log = logging.getLogger("iadeep.controller")
WINDOW_S = 60.0          # rate over the last minute of progress lines
MIN_TOGETHER_S = 60.0    # a pair must share this long before its speeds are recorded
# The most progress files a round reads per node. Each read costs the node a process or two
# (``nodes/shell/jobstate.progress_script``), so with more running jobs than this on a node
# they take turns, longest unread first: a round's cost on a node stops growing with its jobs.
# A rate is over the job's own timestamps (``WINDOW_S``), so reading a file every few rounds
# instead of every round changes no rate, it only comes a little later (a job that writes more
# than a read takes between two reads is read from its latest bytes, as always).
PROGRESS_READS_PER_NODE = 16


@dataclass
class _Track:
    offset: int = 0
    points: list[tuple[float, int]] = field(default_factory=list)
    solo_rate: float | None = None
    solo_sm: float | None = None
    node: str | None = None
    asked: int = -1        # the round an answer last covered the file (-1: never)
    read_at: float = float("-inf")   # when (the controller's clock) it last gave new lines
    total: int | None = None   # the iterations in all, where the job reports it (forecasts)


class SpeedObserver:
    def __init__(self, pool: Pool, reads_per_node: int = PROGRESS_READS_PER_NODE):
        self.pool = pool
        self.reads_per_node = reads_per_node
        self._round = 0
        self._reading: set[int] = set()   # the jobs whose progress this round reads
        self._now = 0.0                   # the round's time (``observe``)
        # (node, job id): the files the polls that answered this round were asked to read
        self._covered: set[tuple[str, int]] = set()
        self.window_s = WINDOW_S   # lab.policy.adapt.window_s, set by the loop each round
        self._tracks: dict[int, _Track] = {}
        self._together: dict[tuple[int, int], float] = {}   # pair -> since when
        self._recorded: set[tuple[int, int]] = set()
        # job id -> its progress rate (it/s) this round, for jobs alone on their GPU: what the
        # phase detector (controller/round/steps/adaptation.py) compares with how the job started
        self.alone_rates: dict[int, float] = {}
        # job id -> its speed this round measured from its progress (not the SM proxy): with
        # its own SM share, what estimates a sharing job's utilisation alone (the phase
        # detector's ``solo_util``)
        self.progress_speeds: dict[int, float] = {}
        # the jobs whose progress each of this round's co-location rows (``observe``'s) came
        # from, in the same order: their owners are whose word the row is (store/profiles.py)
        self.pair_jobs: list[tuple[Job, Job]] = []

    def offsets(self, running: Iterable[Job]) -> dict[int, int]:
        """Job id -> where its progress file is to be read from next, for the running jobs
        whose progress this round reads: on each node at most ``reads_per_node`` of them, the
        longest unread first (a new job before all). The node's one poll command reads them;
        a job's turn counts as taken once a poll that read its file answered (``observe``: a
        node that answers a round late answers for the files its own round asked)."""
        self._round += 1
        per_node: dict[str, list[tuple[int, int, int]]] = {}
        for job in running:
            if job.node is not None and (track := self._track(job)) is not None:
                per_node.setdefault(job.node, []).append((track.asked, job.id, track.offset))
        out: dict[int, int] = {}
        for turns in per_node.values():
            out.update((job_id, offset)
                       for _, job_id, offset in sorted(turns)[:self.reads_per_node])
        self._reading = set(out)
        return out

    def solo_rate(self, job_id: int) -> float | None:
        track = self._tracks.get(job_id)
        return track.solo_rate if track else None

    def observe(self, running: list[Job], snapshot: ClusterSnapshot, now: float,
                known_solo: dict[str, float] | None = None,
                known_util: dict[str, float] | None = None
                ) -> tuple[dict[int, float], list[CoLocation]]:
        """Returns (job id -> observed speed, new co-location rows) for this round.

        A job that never ran alone is compared with ``known_solo[workload]``: the solo rate a
        job with the same label showed when this lab profiled it. A job that reports no
        progress is judged by its processes' SM utilisation (where the poll sees it: NVML, pmon)
        against its own while alone, else its profile's ``known_util[workload]``: a proxy, so
        such speeds are shown but never become co-location rows for the model."""
        groups = _groups(running)
        read = {(n.name, j): (start, size, text) for n in snapshot.nodes
                for j, start, size, text in n.progress}
        speeds: dict[int, float] = {}
        measured: set[int] = set()
        self.alone_rates, self.progress_speeds = {}, {}
        self._now = now
        self._covered = {(n.name, j) for n in snapshot.nodes for j in n.progress_asked}
        for jobs in groups.values():
            for job in jobs:
                # what one job wrote fails only its own measurement (controller/jobfault.py)
                speed = guarded(job, "progress measurement", None, self._from_progress,
                                job, read, len(jobs) == 1, known_solo or {})
                if speed is not None:
                    measured.add(job.id)
                else:
                    speed = guarded(job, "utilisation measurement", None, self._from_sm,
                                    job, snapshot, len(jobs) == 1, known_util or {})
                if speed is not None:
                    speeds[job.id] = speed
        self._forget([j.id for j in running], {n.name for n in snapshot.nodes if n.reached})
        self.progress_speeds = {i: speeds[i] for i in measured}
        return speeds, self._pairs(groups, self.progress_speeds, snapshot, now)

    def work_left(self) -> dict[int, float]:
        """Job id -> its solo work still to do (seconds at full speed), for the running jobs
        that report their total iterations: the iterations left at its rate alone (else at
        its current rate, as if alone). The forecast's ``left`` (scheduler/forecast.py)."""
        out: dict[int, float] = {}
        for job_id, track in self._tracks.items():
            if track.total is None or not track.points:
                continue
            per_s = track.solo_rate or rate(track.points, self.window_s)
            if per_s is None or per_s <= 0:
                continue
            out[job_id] = max(0, track.total - track.points[-1][1]) / per_s
        return out

    def _from_progress(self, job: Job, read: dict[tuple[str, int], tuple[int, int, str]],
                       alone: bool, known_solo: dict[str, float]) -> float | None:
        track = self._track(job)
        if track is None:
            return None
        fresh = self._read(job, track, read)
        current = rate(track.points, self.window_s)
        if current is None:
            return None
        if alone:
            self.alone_rates[job.id] = current
            if fresh:   # a solo rate only from new lines read while alone
                track.solo_rate = current
            return 1.0
        solo = track.solo_rate or known_solo.get(job.spec.workload or "")
        return min(SPEED_CAP, current / solo) if solo else None

    def _from_sm(self, job: Job, snapshot: ClusterSnapshot, alone: bool,
                 known_util: dict[str, float]) -> float | None:
        sm = job_sm(job, snapshot)
        if sm is None:
            return None
        track = self._tracks.setdefault(job.id, _Track(node=job.node))
        if alone:
            track.solo_sm = sm
            return 1.0
        solo = track.solo_sm or known_util.get(job.spec.workload or "")
        return min(SPEED_CAP, sm / solo) if solo else None

    def _track(self, job: Job) -> _Track | None:
        """The job's track on its node (a new attempt elsewhere starts a new one)."""
        if job.node is None:
            return None
        track = self._tracks.setdefault(job.id, _Track(node=job.node))
        if track.node != job.node:   # a new attempt elsewhere: its own file
            track = self._tracks[job.id] = _Track(node=job.node)
        return track

    def _read(self, job: Job, track: _Track, read: dict[tuple[str, int], tuple[int, int, str]]
              ) -> bool:
        """Feed ``track`` what this round read of the job's progress file (``read``: (node,
        job id) -> ``NodeSnapshot.progress``'s entry; a batch system's job's file is on the
        controller's own (shared) filesystem and read here, without blocking, in its turn).
        True if it gave new lines."""
        assert job.node is not None
        before, backend = track.offset, self.pool.backend(job.node)
        if not backend.progress_in_poll:
            if job.id not in self._reading:
                return False
            track.asked = self._round
            try:
                data, size = backend.read_progress(job, track.offset, 1 << 20) or (b"", 0)
            except IadeepError:
                return False
            _feed(track, track.offset, size, data.decode("latin-1"))   # a byte a character
        else:
            if (job.node, job.id) in self._covered:
                track.asked = self._round
            if (job.node, job.id) in read:
                _feed(track, *read[(job.node, job.id)])
        if track.offset == before:
            return False
        track.read_at = self._now
        return True

    def _pairs(self, groups: dict[tuple[str, int], list[Job]], speeds: dict[int, float],
               snapshot: ClusterSnapshot, now: float) -> list[CoLocation]:
        rows = []
        self.pair_jobs = []
        for (node, index), jobs in groups.items():
            if len(jobs) != 2:
                continue
            a, b = sorted(jobs, key=lambda j: j.id)
            key = (a.id, b.id)
            since = self._together.setdefault(key, now)
            # both rates over a window of sharing only: each file read after a full window
            # together (not a turn before, whose lines would still be partly alone)
            read = min(self._tracks[j].read_at for j in key)   # (observe made every track)
            if (key in self._recorded or read - since < MIN_TOGETHER_S or a.id not in speeds
                    or b.id not in speeds or not (a.spec.workload and b.spec.workload)):
                continue
            pair = (round(speeds[a.id], 4), round(speeds[b.id], 4))
            if not measurable(pair):
                # no progress over the window (a validation pass, a checkpoint): a stall,
                # not a slowdown, and a speed no fit accepts (as one over twice the solo
                # speed: a solo rate read too low); the pair is recorded once both move again
                continue
            gpu = snapshot.gpu(node, index)
            rows.append(CoLocation(gpu.name if gpu else "", (a.spec.workload, b.spec.workload),
                                   pair, 1))
            self.pair_jobs.append((a, b))
            self._recorded.add(key)
        return rows

    def _forget(self, alive: list[int], answered: set[str]) -> None:
        """Drop what is known of jobs no longer running. A job on a node that did not answer
        this round is not among ``alive`` but still runs: its solo rate is kept (else one slow
        poll would leave a job that shares from then on unmeasured for good)."""
        keep = set(alive) | {k for k, v in self._tracks.items() if v.node not in answered}
        self._tracks = {k: v for k, v in self._tracks.items() if k in keep}
        self._together = {k: v for k, v in self._together.items() if set(k) <= keep}


def _feed(track: _Track, start: int, size: int, text: str) -> None:
    """Add what a poll read of a progress file (``text``, from offset ``start``; the file's
    ``size`` then) to ``track``: only complete lines (a line being written waits for later),
    never a line twice (a late poll repeats what was read), from the start again after the
    file was rewritten, and from the first whole line where the poll skipped ahead (a job that
    wrote more than a poll reads)."""
    if size < track.offset:   # rewritten: its lines start again
        track.offset, track.points = 0, []
    if start + len(text) <= track.offset:
        return
    if start > track.offset:
        cut = text.find("\n") + 1
        if cut == 0:
            return
        text, start = text[cut:], start + cut
    else:
        text, start = text[track.offset - start:], track.offset
    complete = text[: text.rfind("\n") + 1]
    track.offset = start + len(complete)
    track.points = (track.points + parse_progress(complete))[-2000:]
    total = parse_total(complete)
    if total is not None:
        track.total = total


def _groups(running: list[Job]) -> dict[tuple[str, int], list[Job]]:
    """Single-GPU running jobs grouped by the GPU they share."""
    groups: dict[tuple[str, int], list[Job]] = {}
    for job in running:
        if job.node and len(job.gpu_indices) == 1:
            groups.setdefault((job.node, job.gpu_indices[0]), []).append(job)
    return groups


def job_sm(job: Job, snapshot: ClusterSnapshot) -> float | None:
    """The job's processes' summed SM utilisation on its GPU in this snapshot, if reported."""
    gpu = snapshot.gpu(job.node, job.gpu_indices[0])
    values = [p.sm_util for p in (gpu.processes if gpu else ())
              if p.job_id == job.id and p.sm_util is not None]
    return sum(values) if values else None

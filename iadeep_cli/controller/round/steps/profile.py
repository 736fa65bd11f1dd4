"""Step: profile new workloads: a running job without a profile, sampled while it runs alone
on its GPU, gives its workload a profile after PROFILE_SAMPLES polls."""
from __future__ import annotations

import logging
from pathlib import Path

from ....errors import IadeepError
from ....jobs import Job, JobState
from ....model.data import shipped_profiles
from ....profiles import Profile
from ....snapshot import ClusterSnapshot, GpuSample
from ....store import jobrows, profiles as profrows
from ..context import Context, Round, Step
from ..observer import SpeedObserver

log = logging.getLogger("iadeep.controller")
PROFILE_SAMPLES = 6   # polls of a job alone on its GPU before its profile is recorded


class Profiler(Step):
    def __init__(self, ctx: Context, observer: SpeedObserver):
        super().__init__(ctx)
        self.observer = observer   # controller/round/observer.SpeedObserver: a job's solo rate
        self._samples: dict[int, list[tuple[GpuSample, float | None]]] = {}

    def run(self, r: Round) -> None:
        r.profiles, r.lab = self.profiles(r.snapshot)

    def profiles(self, snapshot: ClusterSnapshot
                 ) -> tuple[dict[str, Profile], dict[str, Profile]]:
        """The profiles in effect this round (shipped, overridden by the lab's of the same
        name), and the lab's own, the ones recorded this round included."""
        shipped, lab = shipped_profiles(), self.lab_profiles()
        lab.update(self._profile_new_workloads(snapshot, {**shipped, **lab}))
        return {**shipped, **lab}, lab

    def lab_profiles(self) -> dict[str, Profile]:
        """Profiles measured in this lab (they override the shipped ones of the same name)."""
        with self.store.tx() as conn:
            return {p.workload: p for p, _source, _at in profrows.load_profiles(conn)}

    def forget(self, job_id: int) -> None:
        """Drop a job's samples (its attempt ended: the next one is sampled afresh)."""
        self._samples.pop(job_id, None)

    def _profile_new_workloads(self, snapshot: ClusterSnapshot,
                               known: dict[str, Profile]) -> dict[str, Profile]:
        """Sample the GPU of each running job without a profile while it runs alone; after
        PROFILE_SAMPLES polls record its profile, so later jobs of the kind can share.
        Returns the profiles recorded this round."""
        recorded: dict[str, Profile] = {}
        for job in self.jobs({JobState.RUNNING}):
            if job.spec.workload in known or len(job.gpu_indices) != 1:
                continue
            sample = _alone_on_gpu(job, snapshot)
            if sample is None:
                continue
            samples = self._samples.setdefault(job.id, [])
            samples.append(sample)
            profile = self._record_profile(job, samples) if len(samples) >= PROFILE_SAMPLES \
                else None
            if profile is not None:
                recorded[profile.workload] = profile
        return recorded

    def _record_profile(self, job: Job, samples: list[tuple[GpuSample, float | None]]
                        ) -> Profile | None:
        from ....model.online import profile_from_samples

        label = job.spec.workload or Path(job.spec.script).stem
        peak_gib = max((mem or 0.0) for _, mem in samples) / 1024.0
        try:
            sample = profile_from_samples(label, samples[0][0].name, [g for g, _ in samples],
                                          peak_gib, solo_it_per_s=self.observer.solo_rate(job.id))
        except IadeepError as exc:
            log.warning("profiling job %s: %s", job.id, exc.message)
            return None
        with self.store.tx() as conn:   # one job's sample never simply replaces a profile
            profile, verdict = profrows.learn(conn, sample, job_id=job.id, owner=job.owner,
                                              now=self.clock(),
                                              shipped=shipped_profiles().get(label))
            jobrows.update(conn, job.id, workload=label)
        self._samples.pop(job.id, None)
        log.log(logging.INFO if profile else logging.WARNING, "profile %r, sample of job %s "
                "(%s): %s", label, job.id, job.owner, verdict)
        return profile


def _alone_on_gpu(job: Job, snapshot: ClusterSnapshot) -> tuple[GpuSample, float | None] | None:
    """(its GPU's sample, the job's memory in MiB) if the job is the only iadeep job on its
    GPU in this snapshot, else None (a profile must describe the job running alone)."""
    gpu = snapshot.gpu(job.node, job.gpu_indices[0])
    if gpu is None or any(p.job_id not in (None, job.id) for p in gpu.processes):
        return None
    mine = [p.used_memory_mib for p in gpu.processes if p.job_id == job.id]
    known = [m for m in mine if m is not None]
    return gpu, (max(known) if mine and len(known) == len(mine) else gpu.memory_used_mib)


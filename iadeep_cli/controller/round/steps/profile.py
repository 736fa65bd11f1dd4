"""Step: profile new workloads: a running job without a profile, sampled while it runs alone
on its GPU, gives its workload a profile after PROFILE_SAMPLES polls.

With ``policy.cold_start: share`` (the default) a new program need not wait for an empty GPU
where the poll gives each process's figures (NVML on the controller's own machine,
``nvidia-smi pmon`` over SSH): its label gets a provisional profile (``Round.provisional``,
``profiles.provisional_profile``: as heavy as the heaviest the lab knows, so placement shares
it only where even such a job pays), and while it shares it is sampled from its own processes'
SM and memory utilisation and memory. Whether a node gives those figures is learnt from its
polls (``figures``): a node whose iadeep jobs' processes carry none (MIG, pmon failed, an old
driver) keeps the old rule for every new program, as does a lab with no profile at all."""
from __future__ import annotations

import logging
from pathlib import Path

from ....errors import IadeepError
from ....jobs import Job, JobState
from ....model.data import shipped_profiles
from ....profiles import SHARED_SAMPLE_BELOW_UTIL, Profile, provisional_profile
from ....scheduler.placement import NO_PROFILE
from ....snapshot import ClusterSnapshot, GpuSample
from ....store import jobrows, profiles as profrows
from ..context import Context, Round, Step
from ..observer import SpeedObserver, job_sm

log = logging.getLogger("iadeep.controller")
PROFILE_SAMPLES = 6   # polls of a job alone on its GPU before its profile is recorded


class Profiler(Step):
    def __init__(self, ctx: Context, observer: SpeedObserver):
        super().__init__(ctx)
        self.observer = observer   # controller/round/observer.SpeedObserver: a job's solo rate
        self._samples: dict[int, list[tuple[GpuSample, float | None]]] = {}
        # node -> whether its poll gives per-process figures: learnt from its polls that
        # showed iadeep jobs' processes (a node never seen with one is not known), and the
        # polls in a row since such a poll last carried a figure
        self.figures: dict[str, bool] = {}
        self._misses: dict[str, int] = {}

    def run(self, r: Round) -> None:
        self._learn_figures(r.snapshot)
        r.profiles, r.lab = self.profiles(r.snapshot)
        r.provisional, r.cold_start = self.provisional(r.snapshot, r.profiles)

    def share_new(self, snapshot: ClusterSnapshot) -> tuple[bool, str]:
        """Whether a program with no profile may start beside others this round, and why
        (a clause for ``queue why``): ``cold_start: share``, at least one node known to give
        per-process figures, and none that placement may use known to lack them."""
        if self.inventory.policy.cold_start != "share":
            return False, "the lab's policy.cold_start is alone"
        usable = {n.name for n in snapshot.nodes if n.placeable}
        lacking = sorted(n for n in usable if self.figures.get(n) is False)
        if lacking:
            return False, (f"node {lacking[0]}'s poll gives no per-process figures (MIG, "
                           "nvidia-smi pmon failing, or an old driver)")
        if not any(self.figures.get(n) for n in usable):
            return False, "no node has shown per-process figures yet"
        return True, ""

    def provisional(self, snapshot: ClusterSnapshot, known: dict[str, Profile]
                    ) -> tuple[dict[str, Profile], str]:
        """Provisional profiles for the labels of queued and running one-GPU jobs without a
        profile, where new programs may share this round (``share_new``), else none; and
        what such a job does, for its waiting reason."""
        labels = sorted({j.spec.workload for j in self.jobs({JobState.QUEUED,
                                                             JobState.RUNNING})
                         if j.spec.workload and j.spec.workload not in known
                         and j.spec.gpus == 1})
        if not labels:
            return {}, ""
        share, why = self.share_new(snapshot)
        if share and known:
            out = {}
            for label in labels:
                prior = provisional_profile(known, label)
                if prior is not None:
                    out[label] = prior
            return out, ("no profile yet: may start beside others under a provisional profile "
                         "(the heaviest the lab knows) and is profiled from its own figures "
                         "while it shares")
        return {}, f"{NO_PROFILE} ({why or 'the lab has no profile to start it under'})"

    def _learn_figures(self, snapshot: ClusterSnapshot) -> None:
        """Note, for each node whose poll shows iadeep jobs' processes, whether any carries
        its SM utilisation. pmon prints ``-`` for a process with no sample in its interval (a
        job loading its data), so one figure among them is enough, and a node that has given
        figures is taken to lack them only after PROFILE_SAMPLES polls in a row without any
        (a node never seen with one lacks them from its first such poll: MIG, no pmon)."""
        for node in snapshot.nodes:
            if not node.ok:
                continue
            ours = [p for g in node.gpus for p in g.processes if p.job_id is not None]
            if not ours:
                continue
            if any(p.sm_util is not None for p in ours):
                self.figures[node.name], self._misses[node.name] = True, 0
                continue
            misses = self._misses[node.name] = self._misses.get(node.name, 0) + 1
            if not self.figures.get(node.name) or misses >= PROFILE_SAMPLES:
                self.figures[node.name] = False

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
        """Sample the GPU of each running job without a profile while it runs alone (with
        ``cold_start: share``, also while it shares, from its own processes' figures); after
        PROFILE_SAMPLES polls record its profile, so later jobs of the kind can share.
        Returns the profiles recorded this round."""
        recorded: dict[str, Profile] = {}
        sharing = self.inventory.policy.cold_start == "share"
        for job in self.jobs({JobState.RUNNING}):
            if job.spec.workload in known or len(job.gpu_indices) != 1:
                continue
            sample = _alone_on_gpu(job, snapshot)
            if sample is None and sharing:
                sample = own_figures(job, snapshot)
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


def own_figures(job: Job, snapshot: ClusterSnapshot) -> tuple[GpuSample, float | None] | None:
    """The job's own figures on a GPU it shares, as a sample of the GPU alone: utilisation its
    processes' summed SM share, memory utilisation their memory-interface share, memory their
    own; power and the rest, which belong to the whole GPU, left out. None unless every one of
    its processes reports its memory and at least one its SM share (NVML, pmon), and unless
    the GPU is less busy than SHARED_SAMPLE_BELOW_UTIL (saturated, the jobs slice its time and
    its share is less than it would use alone)."""
    gpu = snapshot.gpu(job.node, job.gpu_indices[0])
    mine = [p for p in (gpu.processes if gpu else ()) if p.job_id == job.id]
    sm = job_sm(job, snapshot)
    if gpu is None or sm is None or any(p.used_memory_mib is None for p in mine) \
            or gpu.utilization_gpu is None or gpu.utilization_gpu >= SHARED_SAMPLE_BELOW_UTIL:
        return None
    mem = [p.mem_util for p in mine if p.mem_util is not None]
    own = GpuSample(index=gpu.index, uuid=gpu.uuid, name=gpu.name,
                    memory_total_mib=gpu.memory_total_mib,
                    memory_used_mib=sum(p.used_memory_mib or 0.0 for p in mine),
                    utilization_gpu=min(100.0, sm),
                    utilization_memory=min(100.0, sum(mem)) if mem else None,
                    power_limit_w=gpu.power_limit_w, processes=tuple(mine))
    return own, own.memory_used_mib

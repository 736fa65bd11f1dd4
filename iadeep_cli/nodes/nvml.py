"""The controller's own machine (``Node.local``): GPUs through NVML instead of SSH + nvidia-smi.

Same result type as a remote poll (a ``NodeSnapshot``), so nothing downstream cares how a node
was read.  ``pynvml`` (from nvidia-ml-py) is imported lazily: importing it is cheap, but a machine
without the driver must still run `iadeep status`.  Every per-GPU call may raise NVMLError on some
GPUs/drivers (``Not Supported``); each such field becomes ``None`` rather than failing the node.
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from ..snapshot import GpuProcess, GpuSample, NodeSnapshot, RemoteJob, RemoteState
from .gpu import (
    MAX_APPS,
    SAMPLE_FIELDS,
    Expect,
    bounded,
    clean,
    job_map,
    split_sections,
)
from .shell.jobstate import job_sections, parse_progress, state_script

STATE_TIMEOUT_S = 10.0


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # NVMLError_NotSupported and friends: "not available"
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mib(nbytes: Any) -> float | None:
    return None if nbytes is None else nbytes / (1024 * 1024)


def _memory(nv: Any, h: Any) -> Any:
    """Memory info as nvidia-smi reports it, so a local node reads like a remote one.

    NVML's v1 struct counts the driver's reserved memory as used (an idle H200: 615 MiB "used",
    nvidia-smi says 0) and that would leak into profiles' memory; the v2 struct reports it
    apart.  Older drivers or nvidia-ml-py releases lack v2: fall back to v1 there.
    """
    v2 = getattr(nv, "nvmlMemory_v2", None)
    mem = _try(lambda: nv.nvmlDeviceGetMemoryInfo(h, version=v2)) if v2 else None
    return mem if mem is not None else _try(lambda: nv.nvmlDeviceGetMemoryInfo(h))


def _sample(nv: Any, index: int, h: Any, procs: list[Any], jobs: dict[int, int]) -> GpuSample:
    """One GPU's sample.  ``procs`` is the process listing the job map was built from: listing
    again here would show a process that started in between as foreign (the job map never saw
    it), so a poll lists each GPU's processes exactly once.  Values are bounded like a remote
    node's (``gpu.bounded``): a driver's garbage is "not available", never NaN or negative."""
    mem = _memory(nv, h)
    util = _try(lambda: nv.nvmlDeviceGetUtilizationRates(h))
    power = _try(lambda: nv.nvmlDeviceGetPowerUsage(h))
    limit = _try(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
    per_proc = _process_util(nv, h)
    raw = {
        "memory.total": _mib(mem.total) if mem else None,
        "memory.used": _mib(mem.used) if mem else None,
        "memory.free": _mib(mem.free) if mem else None,
        "utilization.gpu": util.gpu if util else None,
        "utilization.memory": util.memory if util else None,
        "temperature.gpu": _try(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        "power.draw": power / 1000.0 if power is not None else None,
        "power.limit": limit / 1000.0 if limit is not None else None,
    }
    return GpuSample(
        index=index,
        uuid=clean(_text(_try(lambda: nv.nvmlDeviceGetUUID(h)) or "")),
        name=clean(_text(_try(lambda: nv.nvmlDeviceGetName(h)) or "")),
        **{attr: bounded(raw[field], field) for attr, field in SAMPLE_FIELDS.items()},
        processes=tuple(sorted(
            (GpuProcess(pid=p.pid, used_memory_mib=bounded(
                        _mib(getattr(p, "usedGpuMemory", None)), "used_memory"),
                        name=_proc_name(p.pid), job_id=jobs.get(p.pid),
                        sm_util=bounded(per_proc.get(p.pid, (None, None))[0], "utilization.gpu"),
                        mem_util=bounded(per_proc.get(p.pid, (None, None))[1],
                                         "utilization.gpu"))
             for p in procs[:MAX_APPS]),
            key=lambda p: p.pid)),
    )


def _process_util(nv: Any, h: Any) -> dict[int, tuple[float, float]]:
    """pid -> (SM, memory) utilisation (%) from the latest per-process sample NVML keeps: the
    speed proxy for jobs that do not report progress (what ``nvidia-smi pmon`` prints for a
    remote node). Not found / not supported: no figures."""
    latest: dict[int, tuple[int, float, float]] = {}
    for sample in _try(lambda: nv.nvmlDeviceGetProcessUtilization(h, 0)) or []:
        if sample.pid not in latest or sample.timeStamp >= latest[sample.pid][0]:
            latest[sample.pid] = (sample.timeStamp, float(sample.smUtil),
                                  float(sample.memUtil))
    return {pid: (sm, mem) for pid, (_, sm, mem) in latest.items()}


def _proc_name(pid: int) -> str:
    try:
        return clean(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def local_job_map(pids: list[int], known: set[int], sessions: dict[int, int]
                  ) -> tuple[dict[int, int], set[int]]:
    """The same pid -> job id mapping as the remote poll script, read straight from /proc;
    and the pids found there."""
    procs = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            sid = stat.rsplit(") ", 1)[1].split()[3]
        except (OSError, IndexError):
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            job = next((e.split(b"=", 1)[1].decode() for e in env
                        if e.startswith(b"IADEEP_JOB_ID=")), "")
        except OSError:
            job = ""
        procs.append(f"{pid} {sid} {job}")
    return job_map("\n".join(procs), known, sessions), {int(p.split()[0]) for p in procs}


def _still_there(nv: Any, h: Any, procs: list[Any], alive: set[int]) -> list[Any]:
    """The listed processes minus those that exited since the listing.  A pid missing from
    our /proc is not proof: NVML also lists processes of other PID namespaces (containers).
    Only a pid that NVML itself no longer lists is gone (else a job's process that just ended
    would show as a stranger's for one poll)."""
    if all(p.pid in alive for p in procs):
        return procs
    again = {p.pid for p in _try(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []}
    return [p for p in procs if p.pid in alive or p.pid in again]


def local_job_states(workdir: str, expect: Expect,
                     progress: Mapping[int, int] | None = None) -> str:
    """The expected jobs' states (and new progress) on this machine: the same shell as a remote
    poll's, bounded in time by its own ``timeout``, and here too (its whole process group is
    killed)."""
    from .local import run_bounded

    _, out, _ = run_bounded(["sh", "-c", state_script(workdir, expect, progress)],
                            STATE_TIMEOUT_S + 2, cwd=os.path.expanduser("~"))
    return out.decode("utf-8", "replace")


def poll_local(name: str, workdir: str = "~/.iadeep", only: tuple[int, ...] | None = None,
               expect: Expect = (), progress: Mapping[int, int] | None = None) -> NodeSnapshot:
    """Read every GPU on this machine through NVML, and the expected jobs' states and new
    progress (``progress``: job id -> offset); an NVML failure is the node's GPU error (its
    jobs are still known, as for a remote node)."""
    start = time.time()
    try:
        sec = split_sections(local_job_states(workdir, expect, progress))
        states, known, sessions = job_sections(sec)
    except (OSError, subprocess.SubprocessError) as exc:
        return NodeSnapshot(name, start, error=f"cannot read the jobs' states: {exc}")
    if states is not None:
        told = {j for j, _ in states}
        states += tuple((int(j), RemoteJob(RemoteState.UNKNOWN)) for j, _, _ in expect
                        if int(j) not in told)
    read = parse_progress(sec)
    snap = partial(NodeSnapshot, name, start, jobs=states, progress=read)
    try:
        import pynvml as nv
    except ImportError:
        return snap(error="pynvml is not installed (pip install nvidia-ml-py)")
    try:
        nv.nvmlInit()
    except Exception as exc:
        return snap(error=f"NVML unavailable: {exc} (is the NVIDIA driver "
                          "installed on the controller's machine?)")
    try:
        driver = _text(_try(nv.nvmlSystemGetDriverVersion) or "") or None
        count = nv.nvmlDeviceGetCount()
        listed = []   # (index, handle, processes): one listing per GPU, used for everything
        for i in range(count):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            listed.append((i, h, _try(partial(nv.nvmlDeviceGetComputeRunningProcesses, h)) or []))
        jobs, alive = local_job_map([p.pid for _, _, procs in listed for p in procs], known,
                                    sessions)
        gpus = tuple(_sample(nv, i, h, _still_there(nv, h, procs, alive), jobs)
                     for i, h, procs in listed if only is None or i in only)
        return snap(gpus=gpus, driver_version=driver, rtt_s=time.time() - start)
    except Exception as exc:
        return snap(error=f"NVML query failed: {exc}")
    finally:
        _try(nv.nvmlShutdown)

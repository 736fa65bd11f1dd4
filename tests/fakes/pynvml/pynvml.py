"""Stand-in ``pynvml`` for test machines without an NVIDIA GPU; replays a real H200.

Put this directory first on the import path (``PYTHONPATH=tests/fakes/pynvml`` for a subprocess,
or ``sys.path.insert(0, ...)`` + ``sys.modules.pop("pynvml")`` in-process) and iadeep's NVML poll
(``iadeep_cli/nodes/nvml.py``) reads it instead of the real nvidia-ml-py.

What is REAL:
- every number: parsed at import from the real nvidia-smi output of one NVIDIA H200 (driver
  580.159.04) in tests/fixtures/nvidia-smi/: ``h200-{idle,loaded}-query-gpu-full...`` and
  ``h200-loaded-compute-apps-full...``, converted to NVML's units (bytes, milliwatts, integer %).
- the processes iadeep launched on this machine: found live in /proc (``IADEEP_JOB_ID`` in their
  environment), put on the GPUs in their ``CUDA_VISIBLE_DEVICES``, like the stand-in nvidia-smi
  (tests/fakes/nvidia-smi); iadeep's wrapper shell (cmdline has ``iadeep-job``) uses no GPU and
  is skipped.
- the API's shape: function names, argument lists, return types (``str`` names/uuids as in
  nvidia-ml-py >= 11.5, objects with attributes), errors as ``NVMLError`` subclasses with NVML's
  own messages, calls before ``nvmlInit``/after the last ``nvmlShutdown`` raising
  ``NVMLError_Uninitialized``, ``nvmlInit`` reference counted.
- memory semantics of the two struct versions (NVML API reference, nvmlMemory_t /
  nvmlMemory_v2_t): v2 (what nvidia-smi shows) has ``used`` without the driver's ``reserved``
  memory; v1 (``version=None``) has ``used = total - free``, i.e. reserved counted as used.
  ``reserved`` is the fixture's total - used - free (615 MiB on the H200).

What is REPLAYED / invented:
- the GPU itself: one fixture row, repeated for FAKE_NVML_GPUS GPUs (default 1); GPU 0 keeps the
  real UUID, others get the same made-up variation as the stand-in nvidia-smi.
- the fixture's 14 foreign training processes (pids 450-463) on GPU 0 in ``loaded``/``na``
  modes: those pids do not belong to them on this machine.
- a launched job's GPU memory: the first process row of the loaded fixture (1838 MiB), and its
  per-process utilisation: the busiest sample of the real capture.
- per-process utilisation of the 14 foreign processes: the real nvmlDeviceGetProcessUtilization
  capture taken on that machine (h200-pair-nvml-process-utilization.json), same pids.

FAKE_NVML_MODE (read at every ``nvmlInit``, so one process can switch between polls):
  idle (default)  the idle H200, no foreign processes
  loaded          the loaded H200 with its 14 foreign processes
  na              loaded, but utilization, temperature, power and limit raise
                  NVMLError_NotSupported and foreign processes' memory is unknown (None), as
                  on GPUs/drivers that lack those counters
  noinit          nvmlInit raises NVMLError_DriverNotLoaded (a machine without the driver)
  garbage         loaded, but utilization, temperature, power, limit and per-process SM
                  figures read 0xFFFFFFFF (what a confused driver's unsigned fields show), and
                  the name carries a terminal escape
FAKE_NVML_GPUS: how many GPUs (default 1).
FAKE_NVML_JOBS_UNDER: if set, only iadeep jobs whose IADEEP_PROGRESS_FILE lies under this
  directory are listed (a test's own node workdir): on a shared test machine other test runs'
  jobs would otherwise show up on this fake GPU too.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import ClassVar

_FX = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
_MIB = 1024 * 1024
_UUID0 = "GPU-bd43dabd-be64-a562-a627-684496845cbc"
_GPU_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total",
               "memory.used", "memory.free", "utilization.gpu", "utilization.memory",
               "temperature.gpu", "power.draw", "power.limit", "clocks.sm", "clocks.max.sm",
               "compute_mode", "mig.mode.current", "persistence_mode")


def _gpu_row(base: str) -> dict[str, str]:
    text = (_FX / f"h200-{base}-query-gpu-full.csv-noheader-nounits.txt").read_text()
    return dict(zip(_GPU_FIELDS, (v.strip() for v in text.strip().split(","))))


def _apps(base: str) -> list[tuple[int, int]]:
    """(pid, used MiB) rows of the fixture's compute-apps output."""
    text = (_FX / f"h200-{base}-compute-apps-full.csv-noheader-nounits.txt").read_text()
    rows = [line.split(",") for line in text.splitlines() if line.strip()]
    return [(int(r[0]), int(r[3])) for r in rows]


_ROWS = {"idle": _gpu_row("idle"), "loaded": _gpu_row("loaded")}
_PROC_UTIL = json.loads((_FX / "h200-pair-nvml-process-utilization.json").read_text())
_FOREIGN = {"idle": _apps("idle"), "loaded": _apps("loaded")}
_JOB_MIB = _FOREIGN["loaded"][0][1]

# ----------------------------------------------------------------------------- constants & errors
NVML_TEMPERATURE_GPU = 0
nvmlMemory_v2 = 0x02000028
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
_MESSAGES = {1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 6: "Not Found",
             9: "Driver Not Loaded"}


class NVMLError(Exception):
    """Like nvidia-ml-py's: ``NVMLError(code)`` gives the subclass for that code."""

    _by_code: ClassVar[dict[int, type]] = {}

    def __new__(cls, value):
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self):
        return _MESSAGES.get(self.value, f"Unknown Error {self.value}")


def _error_class(code: int, name: str) -> type:
    def new(cls, value=code):
        return NVMLError.__new__(cls, value)

    cls = type(name, (NVMLError,), {"__new__": new})
    NVMLError._by_code[code] = cls
    return cls


NVMLError_Uninitialized = _error_class(1, "NVMLError_Uninitialized")
NVMLError_InvalidArgument = _error_class(2, "NVMLError_InvalidArgument")
NVMLError_NotSupported = _error_class(3, "NVMLError_NotSupported")
NVMLError_NotFound = _error_class(6, "NVMLError_NotFound")
NVMLError_DriverNotLoaded = _error_class(9, "NVMLError_DriverNotLoaded")


# ----------------------------------------------------------------------------- state
class _State:
    refs = 0
    mode = "idle"
    count = 1


def _mode() -> str:
    mode = os.environ.get("FAKE_NVML_MODE", "idle")
    if mode not in ("idle", "loaded", "na", "noinit", "garbage"):
        raise ValueError(f"FAKE_NVML_MODE={mode!r}: use idle, loaded, na, noinit or garbage")
    return mode


def _live() -> None:
    if _State.refs <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _row() -> dict[str, str]:
    return _ROWS["idle" if _State.mode == "idle" else "loaded"]


def _supported() -> None:
    if _State.mode == "na":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


_GARBAGE = 0xFFFFFFFF


def _or_garbage(value: int) -> int:
    return _GARBAGE if _State.mode == "garbage" else value


class _Handle:
    def __init__(self, index: int):
        self.index = index

    def __repr__(self):
        return f"<fake nvmlDevice_t {self.index}>"


class _Struct:
    """Attribute bag standing in for nvidia-ml-py's ctypes structures."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return f"{type(self).__name__}({self.__dict__})"


def _h(handle) -> int:
    _live()
    if not isinstance(handle, _Handle) or handle.index >= _State.count:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return handle.index


# ----------------------------------------------------------------------------- the API subset
def nvmlInit() -> None:
    mode = _mode()
    if mode == "noinit":
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    if _State.refs == 0:
        _State.mode = mode
        _State.count = int(os.environ.get("FAKE_NVML_GPUS", "1"))
    _State.refs += 1


def nvmlShutdown() -> None:
    _live()
    _State.refs -= 1


def nvmlSystemGetDriverVersion() -> str:
    _live()
    return _row()["driver_version"]


def nvmlDeviceGetCount() -> int:
    _live()
    return _State.count


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _live()
    if not 0 <= int(index) < _State.count:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(int(index))


def nvmlDeviceGetUUID(handle) -> str:
    i = _h(handle)
    return _UUID0 if i == 0 else f"GPU-bd43dabd-be64-a562-a627-68449684{i:04x}"


def nvmlDeviceGetName(handle) -> str:
    _h(handle)
    return _row()["name"] + ("\x1b[2J" if _State.mode == "garbage" else "")


def nvmlDeviceGetMemoryInfo(handle, version=None) -> _Struct:
    _h(handle)
    r = _row()
    total, used, free = (int(r[k]) * _MIB for k in ("memory.total", "memory.used", "memory.free"))
    if version:
        return _Struct(version=version, total=total, reserved=total - used - free, free=free,
                       used=used)
    return _Struct(total=total, free=free, used=total - free)


def nvmlDeviceGetUtilizationRates(handle) -> _Struct:
    _h(handle)
    _supported()
    r = _row()
    return _Struct(gpu=_or_garbage(int(r["utilization.gpu"])),
                   memory=_or_garbage(int(r["utilization.memory"])))


def nvmlDeviceGetTemperature(handle, sensor) -> int:
    _h(handle)
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _supported()
    return _or_garbage(int(_row()["temperature.gpu"]))


def _milliwatts(field: str) -> int:
    return _or_garbage(round(float(_row()[field]) * 1000))


def nvmlDeviceGetPowerUsage(handle) -> int:
    _h(handle)
    _supported()
    return _milliwatts("power.draw")


def nvmlDeviceGetEnforcedPowerLimit(handle) -> int:
    _h(handle)
    _supported()
    return _milliwatts("power.limit")


def nvmlDeviceGetComputeRunningProcesses(handle) -> list[_Struct]:
    i = _h(handle)
    procs = []
    if i == 0 and _State.mode != "idle":
        procs = [_Struct(pid=pid, usedGpuMemory=None if _State.mode == "na" else mib * _MIB,
                         gpuInstanceId=None, computeInstanceId=None)
                 for pid, mib in _FOREIGN["loaded"]]
    procs += [_Struct(pid=pid, usedGpuMemory=_JOB_MIB * _MIB, gpuInstanceId=None,
                      computeInstanceId=None) for pid in _iadeep_pids_on(i)]
    return procs


def nvmlDeviceGetProcessUtilization(handle, timeStamp) -> list[_Struct]:
    """Per-process SM/memory utilisation samples. The foreign processes replay the real
    nvmlDeviceGetProcessUtilization capture (h200-pair-nvml-process-utilization.json);
    iadeep's own processes get the busiest captured sample (that capture has no iadeep job).
    Like NVML, no sample at all is NVMLError_NotFound."""
    i = _h(handle)
    _supported()
    samples = []
    if i == 0 and _State.mode != "idle":
        samples = [_Struct(pid=s["pid"], timeStamp=1, smUtil=_or_garbage(s["sm"]),
                           memUtil=s["mem"], encUtil=0, decUtil=0) for s in _PROC_UTIL]
    busiest = max(_PROC_UTIL, key=lambda s: s["sm"])
    samples += [_Struct(pid=pid, timeStamp=1, smUtil=busiest["sm"], memUtil=busiest["mem"],
                        encUtil=0, decUtil=0) for pid in _iadeep_pids_on(i)]
    if not samples:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return samples


def _iadeep_pids_on(index: int) -> list[int]:
    """Live processes launched by iadeep whose CUDA_VISIBLE_DEVICES names GPU ``index``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:   # gone, or another user's
            continue
        if not any(e.startswith(b"IADEEP_JOB_ID=") for e in env) or b"iadeep-job" in argv:
            continue
        cvd = next((e.split(b"=", 1)[1].decode() for e in env
                    if e.startswith(b"CUDA_VISIBLE_DEVICES=")), "")
        under = os.environ.get("FAKE_NVML_JOBS_UNDER")
        progress = next((e.split(b"=", 1)[1].decode() for e in env
                         if e.startswith(b"IADEEP_PROGRESS_FILE=")), "")
        if under and not progress.startswith(under.rstrip("/") + "/"):
            continue
        if str(index) in (g.strip() for g in cvd.split(",")):
            out.append(int(d.name))
    return sorted(out)

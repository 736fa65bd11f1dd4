"""Slurm's commands as the controller runs them (``Slurm``), and what they say: the states of
a Slurm job, its GRES, ``squeue``'s jobs, and the name each attempt of an iadeep job has."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import NodeError
from ...settings import SlurmSettings

log = logging.getLogger("iadeep.slurm")
# squeue's states of a job that is over; every other state holds (or will hold) its GPU.
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"})
# squeue's states of a job Slurm has not started (yet, or again): iadeep's job stays `starting`.
WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                     "RESV_DEL_HOLD"})
# squeue's reasons for a job held (``scontrol hold``, by an admin or its user): Slurm will not
# start it until released.
HELD_REASONS = ("JobHeldAdmin", "JobHeldUser")


def held_in_slurm(reason: str | None) -> bool:
    """Whether a pending Slurm job's reason (squeue's, or iadeep's "pending: <reason>") says
    it is held."""
    return (reason or "").endswith(HELD_REASONS)


_GRES = re.compile(r"^(gpu|shard):([A-Za-z0-9_]+):(\d+)")
SLURM_TIMEOUT_S = 20.0


def tag(install_id: str, job_id: int, attempt: int) -> str:
    """The Slurm job name of one attempt: found again after a crash, never reused."""
    return f"{_tag_prefix(install_id, job_id)}{int(attempt)}"


def _tag_prefix(install_id: str, job_id: int) -> str:
    """What every attempt's name of one iadeep job starts with."""
    return f"iadeep-{install_id[:12]}-{int(job_id)}-"


class Slurm:
    """The Slurm commands, run on the controller's machine (a submit host; root, for --uid)."""

    def __init__(self, settings: SlurmSettings, timeout: float = SLURM_TIMEOUT_S):
        self.settings = settings
        self.timeout = timeout
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if settings.conf:
            self.env["SLURM_CONF"] = settings.conf
        elif os.environ.get("SLURM_CONF"):
            self.env["SLURM_CONF"] = os.environ["SLURM_CONF"]

    def run(self, argv: Sequence[str], stdin: bytes | None = None,
            env: Mapping[str, str] | None = None, bare: bool = False) -> str:
        """stdout of a Slurm command; NodeError (one line) when it fails or is missing.
        ``bare``: the command's environment is ``env`` and SLURM_CONF alone (sbatch hands its
        environment to the job, over the owner's login environment). Never a job's variables:
        the command runs as root (``launch`` gives sbatch those in a file)."""
        exe = shutil.which(argv[0], path=self.env["PATH"])
        if exe is None:
            raise NodeError(f"slurm: {argv[0]} not found on the controller's machine",
                            hint="install slurm-client (the controller must be a submit host)")
        try:
            p = subprocess.run([exe, *argv[1:]], input=stdin or b"", capture_output=True,
                               timeout=self.timeout,
                               env={**({k: v for k, v in self.env.items() if k != "PATH"}
                                       if bare else self.env), **(env or {})})
        except subprocess.TimeoutExpired:
            raise NodeError(f"slurm: {argv[0]} did not answer within {self.timeout:g} s",
                            hint="check slurmctld (`scontrol ping`)") from None
        if p.returncode != 0:
            err = p.stderr.decode("utf-8", "replace").strip().splitlines()
            raise NodeError(f"slurm: {argv[0]} failed (exit {p.returncode}): "
                            f"{err[-1] if err else ''}", hint="check slurmctld (`scontrol ping`)")
        return p.stdout.decode("utf-8", "replace")

    def json(self, argv: Sequence[str]) -> dict[str, Any]:
        try:
            got: dict[str, Any] = json.loads(self.run(argv))
            return got
        except ValueError:
            raise NodeError(f"slurm: {argv[0]} --json gave unreadable output",
                            hint="Slurm 21.08 or later is needed") from None




def gpu_types(gres: str, prefix: str) -> dict[str, dict[int, int]]:
    """``gpu:g0:1,shard:g0:4(S:0)`` -> {"gpu": {0: 1}, "shard": {0: 4}} for types
    ``<prefix><index>``; other GRES and untyped GPUs are not iadeep's to place."""
    out: dict[str, dict[int, int]] = {"gpu": {}, "shard": {}}
    for part in gres.split(","):
        m = _GRES.match(part.strip())
        if m and m.group(2).startswith(prefix) and m.group(2)[len(prefix):].isdigit():
            index = int(m.group(2)[len(prefix):])
            out[m.group(1)][index] = out[m.group(1)].get(index, 0) + int(m.group(3))
    return out



def _gres_detail(job: dict[str, Any], prefix: str) -> dict[int, tuple[str, int]]:
    """GPU index -> ("gpu" or "shard", count) that a running Slurm job holds."""
    out: dict[int, tuple[str, int]] = {}
    for part in job.get("gres_detail") or ():
        m = _GRES.match(str(part))
        if m and m.group(2).startswith(prefix) and m.group(2)[len(prefix):].isdigit():
            out[int(m.group(2)[len(prefix):])] = (m.group(1), int(m.group(3)))
    return out


def _exit_code(job: dict[str, Any]) -> int | None:
    """The batch script's exit code; None when Slurm ended it (cancelled, timed out, node
    failed: killed, like a job without an exit file on an SSH node)."""
    state = str(job.get("job_state") or "")
    if state not in ("COMPLETED", "FAILED"):
        return None
    code = job.get("exit_code")
    if isinstance(code, dict):   # newer Slurm: {"return_code": N, "signal": {...}, ...}
        code = code.get("return_code")
        return int(code) if isinstance(code, int) else None
    if not isinstance(code, int):
        return None
    # 22.05: the wait status; a signal is reported as a shell does (128 + its number)
    return 128 + (code & 0x7F) if code & 0x7F else (code >> 8) & 0xFF


@dataclass(frozen=True)
class SlurmJob:
    id: int
    name: str
    state: str
    node: str
    user: str
    gres: dict[int, tuple[str, int]]
    exit_code: int | None
    reason: str = ""   # why Slurm keeps it pending (squeue's state_reason), "None" otherwise


def queue(slurm: Slurm) -> list[SlurmJob]:
    """Every job ``squeue`` knows (ended ones for MinJobAge, 300 s by default)."""
    out = []
    for j in slurm.json(["squeue", "--json"]).get("jobs", []):
        out.append(SlurmJob(int(j["job_id"]), str(j.get("name") or ""),
                            str(j.get("job_state") or ""), str(j.get("nodes") or ""),
                            str(j.get("user_name") or ""),
                            _gres_detail(j, slurm.settings.gpu_type_prefix), _exit_code(j),
                            str(j.get("state_reason") or "")))
    return out

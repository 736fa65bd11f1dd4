"""Slurm as the execution backend: iadeep decides the node, the GPU and who shares it (``plan()``
as for SSH nodes); Slurm starts the job as its owner, enforces limits and keeps accounting.

Why a second backend and not a scheduler plug-in: nothing in Slurm decides whether two jobs
should share a GPU, and iadeep's interference model does. So the inventory's ``slurm:``
partition's nodes become inventory nodes (``backend: slurm``) found with ``sinfo --json``, and
a placement on GPU K becomes one ``sbatch`` pinned to that node and that GPU through typed GRES:
``--gres=gpu:gK:1`` for a GPU of its own (exclusive, multi-GPU or unprofiled jobs, which
``plan()`` never shares), else ``--gres=shard:gK:S`` with S = shards_per_gpu // max_jobs_per_gpu,
so that the jobs ``plan()`` puts together fit, and a whole-GPU job keeps off a shared GPU.

``SlurmPool`` (``pool``) is a ``connection.Pool``: it answers for the Slurm nodes itself (one
``sinfo`` and one ``squeue`` a round, whatever the number of nodes) and hands every other node
to the SSH ``NodePool`` inside it, so SSH nodes and a partition coexist. Its ``backend(name)``
is a ``SlurmBackend`` (``backend``: launch, cancel, signal, suspend, hold...) for a Slurm node,
the shell's for any other; ``commands`` runs Slurm's commands and reads what they say.

Exactly once: every attempt's Slurm job is named ``iadeep-<install>-<job>-<attempt>``. Before
``sbatch`` the launch looks that name up, and a poll of a job that has no Slurm id recorded
(the controller died between deciding and ``sbatch`` returning) finds it by that name; only
when Slurm has no job of that name is the job queued again. The Slurm job id is recorded as
the job's ``remote_pid`` (``iadeep queue show`` prints it).

Slurm jobs that are not iadeep's are foreign load: their GPUs' shares of memory count as used.
"""
from .backend import (
    SlurmBackend,
    cancel,
    find,
    gres,
    hold,
    launch,
    pause,
    progress_path,
    read_file,
    run_dir,
    signal,
    stream_path,
)
from .commands import ENDED, HELD_REASONS, WAITING, Slurm, held_in_slurm, queue, tag
from .pool import SlurmPool, discover, with_slurm_nodes, with_telemetry

__all__ = ["ENDED", "HELD_REASONS", "WAITING", "Slurm", "SlurmBackend", "SlurmPool", "cancel",
           "discover", "find", "gres", "held_in_slurm", "hold", "launch", "pause",
           "progress_path", "queue", "read_file", "run_dir", "signal", "stream_path", "tag",
           "with_slurm_nodes", "with_telemetry"]

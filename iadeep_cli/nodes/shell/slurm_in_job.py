"""What a job on a shell node sees of Slurm (docs/submitting.md "Coming from Slurm"): the
``SLURM_*`` variables single-node scripts read, and two commands put first on its PATH (in
its job directory's ``slurm/``): ``srun``, which runs its command once inside the job's own
GPUs (one task, one node: asking for more fails with one line), and ``scontrol``, whose
``requeue`` asks iadeep to requeue the job: it leaves the ``requeue`` marker in the job
directory (``REQUEUE_MARKER``: the poll reports it, ``snapshot.REQUEUE_ASKED``) and stops
the job's process group; the controller then queues it again instead of ending it.

On a Slurm node (the Slurm backend) none of this is used: the job is a Slurm job and has
Slurm's own.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence

from ...jobs import Job, parse_array

REQUEUE_MARKER = "requeue"
SHIM_DIR = "slurm"

# srun: options with a value (short letters; long ones take one unless listed in NOARG) are
# read, -n/--ntasks, -N/--nodes and --ntasks-per-node must be 1; the command is exec'd.
SRUN = r"""#!/bin/sh
# iadeep's srun: runs its command once, inside this job's GPUs (one task on one node).
n=1; N=1
one() { case "$2" in 1|1-*) ;; *) echo "srun: iadeep runs one task on one node: $1 $2" \
  "needs more (start them from the command, e.g. torchrun --nproc-per-node $2)" >&2
  exit 1;; esac; }
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break;;
    -n|--ntasks|-N|--nodes|--ntasks-per-node)
      [ $# -ge 2 ] || { echo "srun: $1 needs a value" >&2; exit 1; }; one "$1" "$2"; shift 2;;
    --ntasks=*|--nodes=*|--ntasks-per-node=*) one "${1%%=*}" "${1#*=}"; shift;;
    -n*|-N*) one "$(printf %.2s "$1")" "${1#??}"; shift;;
    --multi-prog) echo "srun: iadeep runs one task: --multi-prog needs several" >&2; exit 1;;
    --exclusive|--unbuffered|--label|--overlap|--overcommit|--kill-on-bad-exit|--quiet|\
    --verbose|--pty|--no-kill|--exact|--whole|--spread-job|--disable-status|\
    --oversubscribe|--immediate|--preserve-env|--propagate|--test-only|--x11|--wait) shift;;
    --*=*) shift;;
    --*) shift 2;;
    -[EHIKXQZhlsuvVOk]*) shift;;
    -?) shift 2;;
    -*) shift;;
    *) break;;
  esac
done
[ $# -gt 0 ] || { echo "srun: no command given (it runs a command inside this job)" >&2; exit 1; }
exec "$@"
"""

# scontrol: `requeue ID` / `requeuehold ID` of this job (its SLURM_JOB_ID, or its array's
# ARRAY_INDEX form), `show job [ID]` (a few fields); anything else fails with one line.
SCONTROL = r"""#!/bin/sh
# iadeep's scontrol, inside a job: requeue this job, or show it.
d=$(cd "$(dirname "$0")/.." && pwd)
mine() { [ "$1" = "$SLURM_JOB_ID" ] ||
  [ "$1" = "${SLURM_ARRAY_JOB_ID:-x}_${SLURM_ARRAY_TASK_ID:-x}" ]; }
case "${1:-}" in
  requeue|requeuehold)
    [ $# -eq 2 ] && mine "$2" || {
      echo "scontrol: inside an iadeep job, $1 takes this job's id ($SLURM_JOB_ID) only" >&2
      exit 1; }
    : > "$d/requeue" || exit 1
    kill -TERM 0; exit 0;;
  show)
    [ "${2:-}" = job ] || { echo "scontrol: inside an iadeep job, show job only" >&2; exit 1; }
    echo "JobId=$SLURM_JOB_ID JobName=$SLURM_JOB_NAME"
    echo "   NumNodes=1 NumCPUs=${SLURM_CPUS_PER_TASK:-1} NumTasks=1 NodeList=$SLURM_JOB_NODELIST"
    echo "   TRES=gres/gpu=$SLURM_GPUS_ON_NODE";;
  *) echo "scontrol: inside an iadeep job only 'requeue $SLURM_JOB_ID' and 'show job'" \
       "work (iadeep queue ... for the rest)" >&2; exit 1;;
esac
"""


def install(jdir_q: str) -> str:
    """Shell that writes ``srun`` and ``scontrol`` into the job directory (``jdir_q``,
    quoted) ``slurm/``, run in the job's start script."""
    out = f"mkdir -p {jdir_q}/{SHIM_DIR} || exit 3\n"
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        out += (f"cat > {jdir_q}/{SHIM_DIR}/{name} <<'IADEEP_SHIM_END' || exit 3\n{text}"
                f"IADEEP_SHIM_END\nchmod 700 {jdir_q}/{SHIM_DIR}/{name}\n")
    return out


CGROUP_V1 = "/sys/fs/cgroup/memory"


def memory_cgroup(job_id: int, mib: int | None) -> str:
    """Shell, run in the job directory before the start, that makes the job's memory cgroup
    (cgroup v1) with its --mem limit (no swap beyond it where the kernel counts swap) and
    names it in ``cgroup`` for the wrapper to join; where the job's account cannot, it leaves
    the note that the limit is not enforced in ``memnote`` (the wrapper writes it to the job's
    log). Nothing without --mem."""
    if mib is None:
        return "rm -f cgroup memnote\n"
    limit = int(mib) * 1024 * 1024
    return (
        "rm -f cgroup memnote\n"
        f"c={CGROUP_V1}/iadeep/job-{int(job_id)}-$(pwd | cksum | cut -d' ' -f1)\n"
        f'if mkdir -p "$c" 2>/dev/null && echo {limit} > "$c/memory.limit_in_bytes"; then\n'
        f'  [ -f "$c/memory.memsw.limit_in_bytes" ] && echo {limit} > '
        '"$c/memory.memsw.limit_in_bytes"\n'
        '  echo "$c" > cgroup\n'
        f"else rmdir \"$c\" 2>/dev/null; echo \"iadeep: --mem {int(mib)}M is not enforced on "
        "this node: this account cannot make a memory cgroup (cgroup v1, "
        f"{CGROUP_V1})\" > memnote; fi 2>/dev/null\n"
    )


def variables(job: Job, gpu_indices: Sequence[int], node: str, run_dir: str
              ) -> list[tuple[str, str]]:
    """The ``SLURM_*`` variables of ``job`` on ``node`` with ``gpu_indices``, running in
    ``run_dir`` (SLURM_SUBMIT_DIR: where it was submitted from, else where it runs)."""
    gpus = str(len(gpu_indices))
    out = [("SLURM_JOB_ID", str(job.id)), ("SLURM_JOBID", str(job.id)),
           ("SLURM_JOB_NAME", job.name), ("SLURM_SUBMIT_DIR", job.spec.submit_dir or run_dir),
           ("SLURM_JOB_USER", job.owner), ("SLURM_GPUS", gpus), ("SLURM_GPUS_ON_NODE", gpus),
           ("SLURM_JOB_NODELIST", node), ("SLURM_NODELIST", node), ("SLURMD_NODENAME", node),
           ("SLURM_NTASKS", "1"), ("SLURM_NPROCS", "1"), ("SLURM_NNODES", "1"),
           ("SLURM_JOB_NUM_NODES", "1"), ("SLURM_TASKS_PER_NODE", "1"), ("SLURM_PROCID", "0"),
           ("SLURM_LOCALID", "0"), ("SLURM_NODEID", "0")]
    if job.spec.cpus_per_task is not None:
        out.append(("SLURM_CPUS_PER_TASK", str(job.spec.cpus_per_task)))
    if job.spec.time_limit_s is not None:
        out.append(("SLURM_JOB_TIME_LIMIT_S", str(int(job.spec.time_limit_s))))
    if job.array_id is not None and job.array_index is not None and job.spec.array:
        indices = parse_array(job.spec.array).indices
        steps = {b - a for a, b in itertools.pairwise(indices)}
        out += [("SLURM_ARRAY_JOB_ID", str(job.array_id)),
                ("SLURM_ARRAY_TASK_ID", str(job.array_index)),
                ("SLURM_ARRAY_TASK_COUNT", str(len(indices))),
                ("SLURM_ARRAY_TASK_MIN", str(indices[0])),
                ("SLURM_ARRAY_TASK_MAX", str(indices[-1])),
                ("SLURM_ARRAY_TASK_STEP", str(steps.pop() if len(steps) == 1 else 1))]
    return out

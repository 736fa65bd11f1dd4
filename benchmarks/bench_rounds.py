"""What a scheduling round costs as running jobs grow: a real controller's round (``_tick``: poll
every node over SSH, record, reconcile, read the running jobs' new progress, decide) with 0,
8, 64 and 256 running jobs, on 4 and 16 real sshd nodes, each as a ratio to the round with no
job in the same run.  Target: <= 2x at 8 jobs, and a round that grows with the nodes, not with
the jobs (every job's state and progress come with its node's one poll command).

Real parts: N sshd nodes (127.0.0.x), real detached jobs (``sleep``) started by the launcher on
them, each job's progress file appended to before every round (so every file a round reads has
new bytes; a round reads at most 16 files a node: ``observe.PROGRESS_READS_PER_NODE``), a real
``runtime.Controller`` and its store.  The jobs are recorded running directly
(not through placement: 256 jobs on 4 nodes would need more GPUs than the stand-in has), and
the stand-in nvidia-smi lists no job processes (``noscan``): its own scan of /proc costs
processes per job on every node, which the real tool does not.
Each line also splits the round: the nodes' polls (the shell on every node reading its jobs'
states and progress: on a real lab that runs on the nodes, here on this machine's cores) and the
controller's own part (the rest: the store, reconcile, observe, placement).
The last lines put the two growths side by side: what a job adds to the round once every node
reads its budget of progress files (from 16 to 64 jobs a node on 4 nodes), and what a node adds
to the empty round.  The controller's thread's CPU time is printed too: unlike wall time, the
machine's load does not inflate it.
Usage: .venv/bin/python benchmarks/bench_rounds.py [--nodes 4 16] [--jobs 0 8 64 256]
       [--rounds 7] [--profile N]
"""
from __future__ import annotations

import argparse
import cProfile
import getpass
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers.jobprocs import kill_recorded_jobs
from helpers.sshd import Cluster

JOB = "#!/bin/sh\nexec sleep 3600\n"
GPUS = 8


def _start(ctl, script: Path, index: int, nodes: list[str]) -> tuple[str, int]:
    """Job ``index``: recorded, started on its node by the launcher, recorded running."""
    from iadeep_cli.jobs import JobSpec, JobState
    from iadeep_cli.store import jobrows

    node, gpu = nodes[index % len(nodes)], (index // len(nodes)) % GPUS
    now = time.time()
    with ctl.store.tx() as conn:
        job_id, _ = jobrows.insert(conn, getpass.getuser(), JobSpec(str(script),
                                                                    name=f"bench{index}"), now)
        job = jobrows.transition(conn, job_id, JobState.STARTING, "placed", "bench", now,
                                 node=node, gpu_indices=(gpu,))
    got = ctl.loop.pool.backend(node).launch(job, (gpu,), script)
    with ctl.store.tx() as conn:
        jobrows.transition(conn, job_id, JobState.RUNNING, "running", "bench", time.time(),
                           remote_pid=got.pid, remote_start=got.start, started_at=now)
    return got.job_dir, job_id


def _rounds(ctl, dirs: list[str], rounds: int, step: list[int], profiler=None,
            cpu: list[float] | None = None) -> list[float]:
    """``rounds`` timed rounds, each after one more progress line in every job's file; the
    nodes' polls' share of each is appended to ``ctl.poll_times``.  ``profiler``: a
    ``cProfile.Profile`` that sees the rounds (the controller's own thread only: the polls
    run in the pool's threads).  ``cpu``: each round's CPU time in the controller's own
    thread is appended to it (what the machine's load does not inflate, unlike wall time)."""
    times = []
    for _ in range(rounds):
        step[0] += 1
        for d in dirs:
            with open(f"{d}/progress", "a") as f:
                f.write(f"{time.time():.3f} {step[0] * 10}\n")
        began, cpu_began = time.perf_counter(), time.thread_time()
        if profiler is not None:
            profiler.enable()
        ctl._tick()
        if profiler is not None:
            profiler.disable()
        times.append(time.perf_counter() - began)
        if cpu is not None:
            cpu.append(time.thread_time() - cpu_began)
    return times


def _timed_polls(ctl) -> list[float]:
    """Time every ``poll_all`` of the controller's pool from now on (the nodes' side of a round:
    they all share this machine's cores)."""
    pool, spent = ctl.loop.pool, []
    inner = pool.poll_all

    def poll_all(*args, **kwargs):
        began = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - began)
    pool.poll_all = poll_all
    return spent


def _recorded_polls() -> list[str]:
    """From now on, keep the job part of the last poll a node was sent (what its shell runs
    for its jobs: states and progress; ``jobstate.state_script``) as the list's one item."""
    from iadeep_cli.nodes import poller
    from iadeep_cli.nodes.shell.jobstate import state_script

    last = [""]
    inner = poller.poll_script

    def poll_script(workdir, expect=(), gpu_timeout_s=None, progress=None):
        last[0] = state_script(workdir, expect, progress)
        return inner(workdir, expect, gpu_timeout_s, progress)
    poller.poll_script = poll_script
    return last


def _node_cpu(script: str, repeats: int = 9) -> float:
    """CPU seconds (user + system, the median of ``repeats`` runs) one node's shell spends on
    ``script``, run here as its node would: unlike wall time, other load does not inflate it."""
    spent = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["sh", "-c", script], stdout=subprocess.DEVNULL, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(spent)


def _count_running(ctl) -> int:
    from iadeep_cli.jobs import JobState
    return ctl.service.status().queue[JobState.RUNNING]


def run(n_nodes: int, counts: list[int], rounds: int, profiler=None
        ) -> tuple[dict[int, list[float]], dict[int, list[float]], dict[int, list[float]],
                   dict[int, float]]:
    from iadeep_cli.controller.round.steps.profile import PROFILE_SAMPLES
    from iadeep_cli.controller.runtime import Controller

    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), n_nodes)
        try:
            for node in cluster.nodes.values():
                node.set_fake(gpus=GPUS)
                (node.state / "noscan").write_text("1\n")
            os.environ["HOME"] = str(cluster.home)
            os.environ["IADEEP_HOME"] = str(cluster.home / "state")
            ctl = Controller(cluster.inventory, Path(tmp) / "state")
            script = Path(tmp) / "sleep.sh"
            script.write_text(JOB)
            script.chmod(0o755)
            names = list(cluster.nodes)
            dirs: list[str] = []
            out: dict[int, list[float]] = {}
            polls: dict[int, list[float]] = {}
            cpus: dict[int, list[float]] = {}
            node_cpu: dict[int, float] = {}
            spent = _timed_polls(ctl)
            sent = _recorded_polls()
            step = [0]
            try:
                for _ in range(2):   # connections opened, first reads: not a steady round
                    ctl._tick()
                for count in sorted(counts):
                    while len(dirs) < count:
                        dirs.append(_start(ctl, script, len(dirs), names)[0])
                    # the new jobs' first (whole) reads, and their profiles: each job is a
                    # workload of its own, profiled once after PROFILE_SAMPLES polls alone
                    _rounds(ctl, dirs, PROFILE_SAMPLES + 1, step)
                    if _count_running(ctl) != count:
                        raise SystemExit(f"{_count_running(ctl)} jobs running, not {count}")
                    spent.clear()
                    cpus[count] = []
                    out[count] = _rounds(ctl, dirs, rounds, step,
                                         profiler if count == max(counts) else None,
                                         cpus[count])
                    polls[count] = list(spent)
                    # a node's job part as the last round sent it (the nodes share one workdir)
                    node_cpu[count] = _node_cpu(sent[0])
            finally:
                if ctl.loop is not None:
                    ctl.loop.close()
                ctl.socket.close()
                ctl.store.close()
                kill_recorded_jobs(Path(d) / "pid" for d in dirs)   # the jobs' sessions
        finally:
            cluster.shutdown()
    return out, polls, cpus, node_cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--jobs", type=int, nargs="+", default=[0, 8, 64, 256])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="print the N functions with the most own time in the controller's "
                         "thread over the rounds with the most jobs (cProfile)")
    args = ap.parse_args()
    from iadeep_cli.controller.round.observer import PROGRESS_READS_PER_NODE
    counts = sorted(set(args.jobs) | {0})
    print(f"cpus={os.cpu_count()} rounds={args.rounds} (medians); load average "
          f"{os.getloadavg()[0]:.1f} at start")
    empty: dict[int, float] = {}
    per_job: dict[int, float] = {}   # by node count: what a job past the read budget adds
    for n in args.nodes:
        profiler = cProfile.Profile() if args.profile else None
        got, polls, cpus, node_cpu = run(n, counts, args.rounds, profiler)
        base = empty[n] = statistics.median(got[0])
        own_base = statistics.median(r - p for r, p in zip(got[0], polls[0]))
        for count in counts:
            xs = got[count]
            m = statistics.median(xs)
            own = statistics.median(r - p for r, p in zip(xs, polls[count]))
            print(f"  {n:>2} nodes, {count:>3} running jobs: round median {m * 1000:7.1f} ms "
                  f"(min {min(xs) * 1000:6.1f}, max {max(xs) * 1000:6.1f})  "
                  f"vs no job {m / base:5.2f}x; of it the nodes' polls "
                  f"{statistics.median(polls[count]) * 1000:7.1f} ms, the controller's own "
                  f"part {own * 1000:6.1f} ms ({own / own_base:5.2f}x), its thread's CPU "
                  f"{statistics.median(cpus[count]) * 1000:6.1f} ms; one node's shell for "
                  f"its jobs {node_cpu[count] * 1000:5.1f} ms CPU")
        ratio8 = statistics.median(got[8]) / base if 8 in got else None
        if ratio8 is not None:
            print(f"  {n:>2} nodes: 8 jobs {ratio8:.2f}x the empty round (target <= 2x: "
                  f"{'met' if ratio8 <= 2 else 'MISSED'})")
        # from every node's progress files all read each round to more jobs taking turns
        past = [c for c in counts if c >= PROGRESS_READS_PER_NODE * n]
        if len(past) >= 2:
            lo, hi = past[0], past[-1]
            a, b = statistics.median(got[lo]), statistics.median(got[hi])
            own_job = (statistics.median(cpus[hi]) - statistics.median(cpus[lo])) / (hi - lo)
            per_job[n] = (b - a) / (hi - lo)
            print(f"  {n:>2} nodes: at and past the read budget ({lo} -> {hi} jobs, "
                  f"{lo // n} -> {hi // n} a node) the round grows {b / a:.2f}x, "
                  f"{(b - a) / (hi - lo) * 1000:.2f} ms a job; the controller's thread's CPU "
                  f"{own_job * 1000:.3f} ms a job, a node's shell for its jobs "
                  f"{(node_cpu[hi] - node_cpu[lo]) / (hi - lo) * n * 1000:.3f} ms a job on it")
        if profiler is not None:
            print(f"  {n:>2} nodes, {max(counts)} jobs: where the controller's thread spent "
                  "its time (cProfile, total time per function):")
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.sort_stats("tottime").print_stats(args.profile)
            stats.dump_stats(f"/tmp/bench_rounds-{n}.prof")
    if len(empty) >= 2:
        few, many = min(empty), max(empty)
        print(f"  the empty round, {few} -> {many} nodes: {empty[many] / empty[few]:.2f}x, "
              f"{(empty[many] - empty[few]) / (many - few) * 1000:.1f} ms a node")
        node = (empty[many] - empty[few]) / (many - few)
        for n, job in sorted(per_job.items()):
            print(f"  {n:>2} nodes: a node adds as much to the round as "
                  f"{node / job if job > 0 else float('inf'):.0f} jobs past the read budget")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

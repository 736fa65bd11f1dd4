"""Helpers to run the real `iadeep` CLI and a real controller process in a temporary state dir."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

IADEEP = [sys.executable, "-m", "iadeep_cli"]


def env_for(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IADEEP_")}
    env["IADEEP_HOME"] = str(home)
    env.update(extra)
    return env


def cli(home: Path, *args: str, check: bool = False, **extra: str) -> subprocess.CompletedProcess:
    """Run `iadeep ARGS...` as a real process; returns the completed process (text mode)."""
    proc = subprocess.run([*IADEEP, *args], env=env_for(home, **extra), capture_output=True,
                          text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"iadeep {' '.join(args)} failed: {proc.stderr}")
    return proc


def queue_add(home: Path, *args: str) -> int:
    """`iadeep queue add ARGS...` as a real process that must succeed; the new job's id."""
    return int(cli(home, "queue", "add", *args, check=True).stdout)


class ControllerProcess:
    """`iadeep controller run` in the background; start() waits until its socket answers."""

    def __init__(self, home: Path, inventory: Path | None = None, *extra_args: str,
                 preexec_fn=None, env: dict[str, str] | None = None):
        self.home = home
        self.inventory = inventory
        self.extra_args = list(extra_args)   # e.g. --new-database
        self.preexec_fn = preexec_fn   # e.g. set a resource limit in the controller process
        self.env = env or {}           # more environment (e.g. systemd's NOTIFY_SOCKET)
        self.proc: subprocess.Popen | None = None
        self.log = home / "controller.log"

    def start(self, timeout: float = 180.0) -> ControllerProcess:
        """Start it and wait until it answers. ``timeout`` only bounds a controller that hangs:
        one that starts normally answers in a second or two, but its imports (numpy, paramiko)
        take tens of seconds on a machine loaded by parallel tests; until its socket exists
        this waits without starting a CLI process per check (each would load it further)."""
        args = [*IADEEP, "controller", "run", *self.extra_args]
        self.home.mkdir(parents=True, exist_ok=True)
        if self.inventory:
            args += ["--inventory", str(self.inventory)]
        elif not (self.home / "nodes.yaml").exists():   # a controller needs an inventory
            (self.home / "nodes.yaml").write_text("nodes: []\n")
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(args, env=env_for(self.home, **self.env), stdout=log,
                                         stderr=subprocess.STDOUT, preexec_fn=self.preexec_fn)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited: {self.log.read_text()}")
            if (self.home / "controller.sock").exists() and cli(
                    self.home, "status", "--json").stdout.find('"live": true') >= 0:
                return self
            time.sleep(0.1)
        raise AssertionError(f"controller did not answer: {self.log.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> int | None:
        self.kill(signal.SIGTERM)
        return self.proc.returncode if self.proc else None


def controller_on(tmp_path: Path, nodes: str = "[]", lab: str = "") -> ControllerProcess:
    """A started controller in ``tmp_path/state`` whose inventory, in the default place
    (``state/nodes.yaml``: a second ``controller run`` finds it too), lists ``nodes`` (YAML flow
    style; none by default: jobs are accepted and stay queued) with ``lab`` settings (YAML
    lines, e.g. ``"default_retries: 2"``)."""
    home = tmp_path / "state"
    home.mkdir(parents=True, exist_ok=True)
    settings = "".join(f"  {line}\n" for line in lab.splitlines())
    (home / "nodes.yaml").write_text((f"lab:\n{settings}" if settings else "")
                                     + f"nodes: {nodes}\n")
    return ControllerProcess(home).start()


def wait_jobs(home: Path, done: Callable[[dict], object], timeout: float = 240.0) -> dict:
    """The jobs (by id, as ``jobs_by_id`` reads them through the CLI) once ``done(jobs)``
    holds; ``timeout`` only bounds what never happens (parallel tests on a loaded machine make
    a controller's restart take tens of seconds), and the failure shows the jobs as they are."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = jobs_by_id(home)
        if done(jobs):
            return jobs
        time.sleep(0.2)
    log = home / "controller.log"
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no controller log)"
    raise AssertionError(f"timed out; jobs now: {json.dumps(jobs_by_id(home), indent=1)}\n"
                         f"controller log (end):\n{tail}")


# What a look at something not there yet raises: a list of nodes still empty before the first
# poll round, a key or file not written yet, a process that exited while /proc was read, half a
# JSON document. Never AssertionError: an invariant a check asserts must fail the first time.
NOT_YET = (IndexError, KeyError, StopIteration, ValueError, OSError)


FINISHED = frozenset({"succeeded", "failed", "cancelled", "timeout"})   # a job's final states


def wait_finished(home: Path, ids: Iterable[int], timeout: float = 240.0) -> dict:
    """The jobs (by id, ``wait_jobs``) once every one of ``ids`` is in a final state."""
    wanted = list(ids)
    return wait_jobs(home, lambda jobs: all(jobs[i]["state"] in FINISHED for i in wanted),
                     timeout)


def wait_until(fn, limit: float = 60.0, every: float = 0.05):
    """Poll ``fn`` until it returns something truthy (returned), or fail after ``limit`` s.
    ``limit`` only bounds a condition that is never reached: generous, since on a machine
    loaded by parallel tests what takes a second alone can take tens. A ``NOT_YET`` error
    counts as not yet; the last one is raised if the time runs out."""
    end = time.monotonic() + limit
    error: Exception | None = None
    while time.monotonic() < end:
        try:
            value = fn()
        except NOT_YET as exc:
            error, value = exc, None
        else:
            error = None
        if value:
            return value
        time.sleep(every)
    if error is not None:
        raise error
    raise AssertionError("condition not reached")


def rounds_after(home: Path, at: float, rounds: int = 1, limit: float = 120.0) -> float:
    """Wait until the controller has run ``rounds`` whole scheduling rounds that began after
    ``at`` (epoch seconds); their last heartbeat. A heartbeat is written as a round ends, so the
    first one after ``at`` may end a round that began before it: that one is not counted."""
    def beat_after(since: float) -> float:
        return wait_until(lambda: (b := json.loads(cli(home, "status", "--json", check=True)
                                                   .stdout)["controller"]["heartbeat_at"])
                          > since and b, limit=limit)
    last = beat_after(at)
    for _ in range(rounds):
        last = beat_after(last)
    return last


def jobs_by_id(home: Path) -> dict:
    """Every job in the state directory, through the real CLI, keyed by id."""
    import json

    out = cli(home, "queue", "list", "--all", "--json", check=True).stdout
    return {j["id"]: j for j in json.loads(out)}


def process_states(pids: list[int]) -> set[str]:
    """The /proc states (R, S, T ...) of those of ``pids`` still alive. A zombie has exited
    (its parent has not reaped it yet: a job's shell stopped by SIGSTOP right after its
    ``sleep`` ended keeps it so until SIGCONT), so it is not counted, nor a pid gone."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):   # gone, or exiting
            continue
        if state != "Z":
            out.add(state)
    return out


def attempt_processes(job_id: int, node: str, home: Path | None = None) -> list[int]:
    """pids of processes of ``job_id``'s attempt on ``node`` (its progress file names both);
    with ``home`` (a controller's state directory) only that installation's job, not a
    leftover of an earlier test's job with the same id."""
    from iadeep_cli.paths import StateDir

    from .sshd import proc_files

    install = StateDir(home).install_id.read_text().strip() if home is not None else ""
    tail = f"{'/' + install if install else ''}/{node}/jobs/{job_id}/progress".encode()
    found = []
    for environ in proc_files("environ"):
        try:
            env = environ.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"IADEEP_PROGRESS_FILE=") and e.endswith(tail) for e in env):
            found.append(int(environ.parent.name))
    return found


def kill_attempt(job_id: int, node: str, home: Path | None = None) -> None:
    """Kill every process of a job's attempt on a node, as a power cut or reboot would."""
    for pid in attempt_processes(job_id, node, home):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_lab(cluster, tmp_path: Path, inventory: Path) -> ControllerProcess:
    """A controller for ``cluster`` on ``inventory``, started; ``.cluster`` is set."""
    ctl = ControllerProcess(tmp_path / "state", inventory)
    ctl.cluster = cluster
    return ctl.start()


@contextmanager
def fake_gpu_lab(sshd_cluster, tmp_path: Path, nodes: int = 1, gpus: int = 1,
                 lab: str = "node_grace: 3",
                 edit_nodes: Callable[[str], str] | None = None) -> Iterator[ControllerProcess]:
    """A controller polling every 0.3 s over ``nodes`` real sshd nodes (``sshd_cluster``'s),
    each with ``gpus`` stand-in GPUs, started in ``tmp_path/state`` with its inventory in
    ``tmp_path/nodes.yaml``; stopped on leaving. ``lab``: more lab settings (YAML lines);
    ``edit_nodes``: rewrites the nodes' YAML (e.g. to add labels). ``.cluster`` is set."""
    cluster = sshd_cluster(nodes)
    for node in cluster.nodes.values():
        node.set_fake(gpus=gpus)
    settings = "".join(f"  {line}\n" for line in ["poll_interval: 0.3", *lab.splitlines()])
    text = cluster.inventory_yaml()
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text(f"lab:\n{settings}" + (edit_nodes(text) if edit_nodes else text))
    ctl = start_lab(cluster, tmp_path, inventory)
    try:
        yield ctl
    finally:
        ctl.stop()

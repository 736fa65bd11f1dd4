"""The shell backend (``BackendKind.SSH``): jobs run by a POSIX shell on the node, over SSH
(or on the controller's own machine), as ``ShellBackend`` (a ``nodes.backend.Backend``) hands
them to the controller; the functions below do the work, one node at a time.

A job lives in ``{Node.workdir}/jobs/{job_id}/`` (0700) on its node:
  ``bin/<script>`` (uploaded by SFTP), ``launched`` (created atomically before start: the launch
  lock), ``env`` (the job's --env/--export, removed before the job starts), ``pid``
  ("PID STARTTIME"; pid == pgid == sid, started with setsid), ``log``
  (stdout+stderr), ``progress`` (IADEEP_PROGRESS_FILE, written by the job if it wants), ``exit``
  (exit code).  The launch also returns the pid and start time, which the controller records:
the job can rewrite or delete its own files, so those files are only read bounded and
validated, and a job whose recorded session leader lives is running whatever its files say.
Because the directory is the record of a launch, a restarted controller can ``reconcile`` and
learn the truth, and a second ``launch`` of the same job never starts it twice.

Every user-supplied value (name, args, env, paths) reaches the remote shell only through
``shlex.quote``; the wrapper script is a constant that receives them as positional arguments.
The job's --env and --export values travel on the launch's standard input, never in an argv
(every account on a node can read every process's command line).

On a ``run_as: submitter`` node every function here takes the job's ``owner`` and runs its
script as them (``runas``), in the owner's own ``~/.iadeep/<install id>/<node>/jobs/<id>/``;
the script is then sent on stdin, not by SFTP (the SSH account cannot write there).
"""
from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from ... import jobopts
from ...errors import InputError, NodeError, NotFoundError, OwnerFilesError
from ...jobs import MAX_INPUT, SIGNALS, TTY_INPUT, Job, checkpoint_signal_of
from ...settings import BackendKind
from ...snapshot import RemoteJob
from .. import runas
from ..backend import (
    MAX_LOG_READ,
    OPEN_FAILED,
    OPEN_FAILED_LINE,
    LaunchResult,
    LogBytes,
    log_bytes,
)
from ..connection import NodeAccess
from ..gpu import Expect, remote_path, split_sections
from . import slurm_in_job
from .jobstate import _READ_PIDFILE, IS_OURS, READ_CONTROL, parse_states, state_script

# Lists (``t=$(tagged)``) this account's processes tagged as job $i of directory $a, i.e. with
# the IADEEP_JOB_ID and IADEEP_PROGRESS_FILE that launch gave it: whatever the job forks keeps
# them, in a session of its own (setsid) or after it deleted its pid file.  One grep reads every
# environment (each bounded by the kernel's exec limit; others' are unreadable unless root, and
# skipped then by owner); the calling shell and its own children (this scan) are left out.
_TAGGED = r"""tagged() { for f in $(grep -lsxzF "IADEEP_JOB_ID=$i" /proc/[0-9]*/environ); do
  x=${f#/proc/}; x=${x%/environ}; [ "$x" != $$ ] && [ -O "/proc/$x" ] || continue
  px=$(sed 's/.*) //' "/proc/$x/stat" 2>/dev/null | cut -d' ' -f2)
  [ "$px" != $$ ] && grep -qsxzF "IADEEP_PROGRESS_FILE=$a/progress" "$f" && echo "$x"
done; }
"""
# Runs as the session leader: records the exit code even after SIGTERM (or a --signal) to the
# group (the trap makes sh survive it; the job itself gets the default action, or its own
# handler, since handlers reset on exec).
# Before that, whatever the job left running is stopped (TERM, then KILL a second later), so an
# ended job holds no GPU through a daemon it forked.
# Its own stdout and stderr are the job directory's ``log``; the job's go to --output/--error
# ($o, $e) when given, opened after the cd (relative names start in the working directory). A
# file that cannot be opened fails the job before it runs, with exit code OPEN_FAILED (122) and
# the shell's message in ``log`` on a line of its own after OPEN_FAILED_LINE (the controller
# reads it into the failure reason; both are the backends' contract, in ``nodes.backend``).
_WRAPPER = r"""d=$1; w=$2; o=$3; e=$4; shift 4
[ -d "$d/slurm" ] && PATH="$d/slurm:$PATH" && export PATH
mc=; [ -s "$d/cgroup" ] && read -r mc < "$d/cgroup" && { echo $$ > "$mc/cgroup.procs"; } \
  2>/dev/null || mc=
[ -s "$d/memnote" ] && cat "$d/memnote" >&2
trap : TERM HUP INT QUIT USR1 USR2 ALRM
run() { if [ -n "$o" ] && [ -n "$e" ]; then "$@" >"$o" 2>"$e"
  elif [ -n "$o" ]; then "$@" >"$o" 2>&1; elif [ -n "$e" ]; then "$@" 2>"$e"; else "$@"; fi; }
opened() { for f in "$o" "$e"; do [ -z "$f" ] || { : >>"$f"; } 2>&1 || return 1; done; }
if ! cd "$w"; then echo "iadeep: cannot cd to $w" >&2; rc=126
elif m=$(opened); then run "$@"; rc=$?
else printf '%s\n' "iadeep: cannot open the job's output: ${m#*: [0-9]*: }" >&2; rc=122; fi
i=$IADEEP_JOB_ID; a=$d; unset IADEEP_JOB_ID
""" + _TAGGED + r"""t=$(tagged)
if [ -n "$t" ]; then kill -TERM $t 2>/dev/null; sleep 1; t=$(tagged); kill -KILL $t 2>/dev/null; fi
if [ -n "$mc" ]; then k=$(sed -n 's/^oom_kill //p' "$mc/memory.oom_control" 2>/dev/null)
  f=$(cat "$mc/memory.failcnt" 2>/dev/null)
  if [ -n "$k" ]; then [ "$k" -gt 0 ]; else [ "$rc" = 137 ] && [ "${f:-0}" -gt 0 ]; fi &&
    : > "$d/memlimit"
  echo $$ > "${mc%/iadeep/*}/cgroup.procs" 2>/dev/null; rmdir "$mc" 2>/dev/null; fi
echo "$rc" > "$d/exit.tmp" && mv "$d/exit.tmp" "$d/exit"
"""
assert OPEN_FAILED_LINE in _WRAPPER and f"rc={OPEN_FAILED};" in _WRAPPER   # the contract's
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Sets $p (the pid) and $ours (1 or 0) from "$d/pid", read bounded, without blocking and
# checked (see jobstate.py).
_IS_OURS = READ_CONTROL + _READ_PIDFILE + IS_OURS


class ShellBackend:
    """``nodes.backend.Backend`` for one node whose jobs a shell runs (see the module's
    docstring for the job directory), over the pool's connection to it."""

    kind = BackendKind.SSH
    keeps_jobs_pending = False   # a launched job runs at once; a held one is never launched
    progress_in_poll = True      # the poll's state script reads new progress bytes
    job_dirs = True
    interactive = True           # a --pty job's keystrokes go into its job directory's FIFO

    def __init__(self, pool: NodeAccess, node: str):
        """NotFoundError for a node the inventory does not list; NodeError for one whose jobs
        another backend runs (a pool of shell nodes cannot reach it)."""
        kind = pool.node(node).backend
        if kind != BackendKind.SSH:
            raise NodeError(f"node {node} is a {kind} node but the pool has no {kind} access")
        self.pool, self.node = pool, node

    def launch(self, job: Job, gpu_indices: Sequence[int], script: str | Path) -> LaunchResult:
        return launch(self.pool, self.node, job, gpu_indices, script)

    def cancel(self, job_id: int, grace_s: float = 10.0, owner: str | None = None) -> str:
        return cancel(self.pool, self.node, job_id, grace_s, owner)

    def signal(self, job_id: int, name: str, owner: str | None = None) -> bool:
        return signal(self.pool, self.node, job_id, name, owner)

    def suspend(self, job_id: int, owner: str | None = None) -> bool:
        return pause(self.pool, self.node, job_id, True, owner)

    def resume(self, job_id: int, owner: str | None = None) -> bool:
        return pause(self.pool, self.node, job_id, False, owner)

    def hold(self, job_id: int, owner: str | None = None) -> bool:
        return False   # no queue of its own: nothing waits here

    def release(self, job_id: int, owner: str | None = None) -> bool:
        return False

    def is_held(self, remote: RemoteJob) -> bool:
        return False

    def states(self, expect: Sequence[int] | Expect, owner: str | None = None
               ) -> dict[int, RemoteJob]:
        return reconcile(self.pool, self.node, expect, owner)

    def read_log(self, job_id: int, offset: int = 0, max_bytes: int = 65536,
                 owner: str | None = None, job: Job | None = None,
                 stream: str = "output") -> LogBytes:
        return read_log(self.pool, self.node, job_id, offset, max_bytes, owner, job, stream)

    def read_progress(self, job: Job, offset: int, max_bytes: int
                      ) -> tuple[bytes, int] | None:
        return read_progress(self.pool, self.node, job, offset, max_bytes)

    def write_input(self, job: Job, data: bytes) -> None:
        write_input(self.pool, self.node, job, data)

    def set_aside(self, job_id: int, suffix: str, owner: str | None = None) -> None:
        set_aside(self.pool, self.node, job_id, suffix, owner)

    def clean(self, job_ids: Sequence[int], owner: str | None = None) -> None:
        clean_finished(self.pool, self.node, job_ids, owner)


def job_dir(workdir: str, job_id: int) -> str:
    return f"{workdir.rstrip('/')}/jobs/{int(job_id)}"


def workdir(pool: NodeAccess, node: str) -> str:
    """Where ``node``'s job directories are (``jobs/<id>`` below it), as its shell sees it."""
    n = pool.node(node)
    return runas.user_workdir(n) if n.submitter else n.workdir


def _sh(pool: NodeAccess, node: str, script: str, timeout: float | None = None,
        owner: str | None = None, stdin: bytes | None = None, setup: bool = False) -> str:
    """Run a POSIX sh script on the node (whatever the login shell is), as the job's
    ``owner`` on a submitter node; stdout, or NodeError (RunAsRefused: it could not run as
    the owner, and nothing of it ran; OwnerFilesError: a ``setup`` script run as the owner, in
    the owner's home, failed there)."""
    if pool.node(node).submitter:
        if owner is None:
            raise InputError(f"node {node} runs jobs as their submitters; the job's owner is "
                             "needed to act on it")
        rc, out, err = runas.run(pool, node, owner, script, timeout=timeout, stdin=stdin)
    else:
        rc, out, err = pool.run(node, ["sh", "-c", script], timeout=timeout, stdin=stdin)
    if rc != 0 and setup and owner is not None and pool.node(node).submitter:
        raise OwnerFilesError(f"exit {rc}: "
                              f"{' '.join((err.strip() or out.strip()).splitlines()[-1:])}")
    if rc != 0:
        raise NodeError(f"node {node}: remote command failed (exit {rc}): "
                        f"{(err.strip() or out.strip()).splitlines()[-1:] or ''}",
                        hint="check the node's workdir permissions and free space")
    return out


def _env_args(job: Job, gpu_indices: Sequence[int], jdir: str, node: str = "",
              where: str = "") -> list[str]:
    """iadeep's own variables and Slurm's (``slurm_in_job``), as ``env`` arguments (nothing
    secret: every member sees them)."""
    ours = [("CUDA_VISIBLE_DEVICES", ",".join(str(int(i)) for i in gpu_indices)),
            ("IADEEP_JOB_ID", str(job.id)), ("IADEEP_JOB_NAME", job.name),
            ("IADEEP_PROGRESS_FILE", f"{jdir}/progress"),
            # how many times it started before this attempt (requeued or retried): as Slurm's
            # SLURM_RESTART_COUNT, so a --requeue job knows to resume from its checkpoint
            ("IADEEP_RESTART_COUNT", str(max(0, job.attempts - 1)))]
    if (ck := checkpoint_signal_of(job.spec)) is not None:   # the hooks listen for it
        ours.append(("IADEEP_CHECKPOINT_SIGNAL", ck))
    if job.array_id is not None:   # as Slurm's SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID
        ours += [("IADEEP_ARRAY_JOB_ID", str(job.array_id)),
                 ("IADEEP_ARRAY_INDEX", str(job.array_index))]
    ours += slurm_in_job.variables(job, gpu_indices, node, where or jdir)
    return [shlex.quote(f"{k}={v}") for k, v in ours]


def _env_file(job: Job) -> bytes:
    """The job's --export and --env variables as sh ``export`` lines (--env's win): sent on
    the launch's standard input, never in an argv, since any account on the node can read
    every process's /proc/PID/cmdline."""
    for key, _ in (*job.spec.exported, *job.spec.env):
        if not _ENV_NAME.match(key):
            raise InputError(f"job {job.id}: environment variable name {key!r} is not valid",
                             hint="use letters, digits and _ (not starting with a digit)")
    return "".join(f"export {k}={shlex.quote(v)}\n"
                   for k, v in (*job.spec.exported, *job.spec.env)).encode()


def run_dir(pool: NodeAccess, node: str, job: Job) -> str | None:
    """The job's working directory on ``node`` (None: its job directory): ``jobopts.run_dir``."""
    return jobopts.run_dir(job.spec, pool.node(node).shared_paths)


def stream_path(pool: NodeAccess, node: str, job: Job, stream: str) -> str:
    """The path of the job's ``stream`` ("output" or "error") on ``node``, as the controller
    reads it (``jobopts.stream_path``): relative to the working directory, the job directory's
    ``log`` for output without --output."""
    jdir = job_dir(workdir(pool, node), job.id)
    return jobopts.stream_path(job, stream, f"{jdir}/log", run_dir(pool, node, job) or jdir)


def launch(pool: NodeAccess, node: str, job: Job, gpu_indices: Sequence[int],
           script_path_local: str | Path) -> LaunchResult:
    """Upload the script and start it detached; never starts a job whose dir says it started.

    Three round trips: make the dir (and learn its absolute path / existing pid), SFTP the
    script, start it.  The start re-checks the lock atomically (``set -C``) so two controllers
    racing cannot both start it.
    """
    script = Path(script_path_local)
    if not script.is_file():
        raise NotFoundError(f"job {job.id}: script {script} not found on the controller",
                            hint="submit the job again with an existing script")
    owner = job.owner
    d = remote_path(job_dir(workdir(pool, node), job.id))
    try:
        found = _sh(pool, node, f"umask 077; d={d}; "
                    'mkdir -p "$d/bin" && chmod 700 "$d" && cd "$d" && pwd && '
                    "{ cat pid 2>/dev/null; true; }",   # a failed mkdir is a NodeError
                    owner=owner, setup=True)
        lines = found.splitlines()
        jdir = lines[0]
        if len(lines) > 1 and lines[1].strip():
            pid, st = _pid_line(lines[1])
            return LaunchResult(pid, pid, jdir, already_started=True, start=st)
        # In its own folder: a script named like a control file (pid, exit, log...) can't
        # clobber it.
        remote_script = f"{jdir}/bin/{script.name}"
        if pool.node(node).submitter:   # into the owner's directory, as the owner
            q = shlex.quote(remote_script)
            _sh(pool, node, f"umask 077; cat > {q} && chmod 700 {q}", owner=owner,
                stdin=script.read_bytes(), setup=True)
        else:
            pool.connection(node).put(script, remote_script, 0o700)
    except OwnerFilesError as exc:   # nothing started: say so in the owner's words
        raise OwnerFilesError(
            f"could not prepare job {job.id} in {owner}'s home on node {node}: {exc.message}",
            hint=f"free space in your home directory on {node} (or make ~/.iadeep writable "
                 f"there), then `iadeep queue release {job.id}`") from None
    where = run_dir(pool, node, job)
    cwd = remote_path(where) if where else shlex.quote(jdir)
    spec = job.spec
    # As the wrapper opens them, after its cd: relative names stay relative (stream_path
    # makes the same paths absolute to read them).
    out_file, err_file = ("''" if p is None else remote_path(
        jobopts.expand_pattern(p, job.id, job.owner, job.name, job.array_id, job.array_index,
                               node)) for p in (spec.output, spec.error))
    argv = " ".join(shlex.quote(a) for a in (remote_script, *job.spec.args))
    start = (
        f"umask 077; cd {shlex.quote(jdir)} || exit 3\n"
        "if ! (set -C; : > launched) 2>/dev/null; then\n"
        '  echo "exists $(head -c 64 pid 2>/dev/null)"; exit 0; fi\n'
        # the job's variables: from stdin into a file only its account reads, gone from the
        # directory before the job starts; exported by the subshell that becomes the job
        'cat > env && exec 3< env && rm -f env || exit 3\n'
        + slurm_in_job.install(shlex.quote(jdir))
        + slurm_in_job.memory_cgroup(job.id, spec.host_mem_mib) +
        # A job started in the background (&) by a shell would ignore SIGINT and SIGQUIT for
        # good: it gets them back where env can (coreutils 8.31+), so --signal INT, and Ctrl-C
        # in `iadeep run --pty`, reach it.
        'e=env; env --default-signal=INT true 2>/dev/null && e="env --default-signal=INT,QUIT"\n'
        f"(. /dev/fd/3; exec 3<&- setsid $e "
        f"{' '.join(_env_args(job, gpu_indices, jdir, node, where or jdir))} "
        f"sh -c {shlex.quote(_WRAPPER)}"
        f" iadeep-job {shlex.quote(jdir)} {cwd} {out_file} {err_file} {argv}"
        ") </dev/null >log 2>&1 &\n"
        "exec 3<&-\n"
        'st=$(sed "s/.*) //" /proc/$!/stat 2>/dev/null | cut -d" " -f20)\n'
        # reported even if the job already removed its own directory: the controller records
        # the pid and start time, and never takes a started job for one that did not start
        '{ echo "$! $st" > pid.tmp && mv pid.tmp pid; } 2>/dev/null; echo "started $! $st"\n'
    )
    out = _sh(pool, node, start, owner=owner, stdin=_env_file(job)).split()
    try:
        pid, st = _pid_line(" ".join(out[1:]))
    except ValueError:
        raise NodeError(f"node {node}: job {job.id} dir {jdir} was claimed by another launch "
                        f"but has no pid", hint="reconcile the job; remove the dir to retry") \
            from None
    return LaunchResult(pid, pid, jdir, already_started=out[0] == "exists", start=st)


def write_input(pool: NodeAccess, node: str, job: Job, data: bytes) -> None:
    """``Backend.write_input``: ``data`` into the job's FIFO, as its owner, by ``dd`` that
    neither blocks (no reader: the job has ended), follows a link nor creates a file."""
    if len(data) > MAX_INPUT:
        raise InputError(f"at most {MAX_INPUT} bytes of input at once, got {len(data)}")
    fifo = remote_path(f"{job_dir(workdir(pool, node), job.id)}/{TTY_INPUT}")
    try:
        _sh(pool, node, f"f={fifo}; [ -p \"$f\" ] || exit 3\n"
                        'exec dd of="$f" oflag=nonblock,nofollow conv=nocreat bs=4096 '
                        "status=none", owner=job.owner, stdin=data, timeout=10.0)
    except NodeError:
        raise NodeError(f"job {job.id} has no terminal on node {node} (it has ended, or it is "
                        "not an `iadeep run --pty` job)",
                        hint=f"`iadeep queue show {job.id}` says how it ended") from None


def _pid_line(text: str) -> tuple[int, int | None]:
    """"PID [STARTTIME]" -> (pid, start time or None); ValueError if there is no pid."""
    parts = text.split()
    if not parts or not parts[0].isdigit() or len(parts[0]) > 10:
        raise ValueError(text[:64])
    start = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() and len(parts[1]) < 20 \
        else None
    return int(parts[0]), start


def _find_job(pool: NodeAccess, node: str, job_id: int) -> str:
    """Shell that finds the job's processes: sets $d (its directory), $a (the absolute one, as
    launch put it in the job's environment, even if the job removed it), the ``tagged`` function
    and $g (the recorded session leader, if the pid file is valid and names it; else empty)."""
    d = job_dir(workdir(pool, node), job_id)
    return (
        f"d={remote_path(d)}; i={int(job_id)}\n"
        'a=$(cd "$d" 2>/dev/null && pwd || { cd "${d%/*}" 2>/dev/null && echo "$(pwd)/$i"; })\n'
        + _TAGGED +
        'g=""\n'
        'if [ -f "$d/pid" ]; then\n' + _IS_OURS + '[ "$ours" = 1 ] && g=$p; fi\n'
    )


def cancel(pool: NodeAccess, node: str, job_id: int, grace_s: float = 10.0,
           owner: str | None = None) -> str:
    """Stop the job: TERM its process group and every process tagged with it (see _TAGGED: a
    daemon it forked into a new session, or a job that deleted its pid file, is found all the
    same), KILL what is left after ``grace_s``.  Safe to call for an ended job (it stops its
    leftovers).  Returns "terminated" | "killed" | "not-running" | "missing" (no pid file and
    nothing of the job runs: never launched)."""
    steps = max(1, int(grace_s * 5))
    script = (
        _find_job(pool, node, job_id) +
        # alive: is anything of the job left (sets $t, its tagged pids); hit SIG: signal it all
        'alive() { t=$(tagged); [ -n "$t" ] || { [ -n "$g" ] && kill -0 "-$g" 2>/dev/null; }; }\n'
        'hit() { [ -n "$g" ] && kill -"$1" "-$g" 2>/dev/null; [ -z "$t" ] || kill -"$1" $t '
        "2>/dev/null; }\n"
        'alive || { [ -f "$d/pid" ] && echo not-running || echo missing; exit 0; }\n'
        "hit TERM\n"
        "hit CONT\n"   # a suspended job (SIGSTOP) acts on its TERM only once continued
        f"n=0; while [ $n -lt {steps} ]; do alive || {{ echo terminated; exit 0; }}; sleep 0.2; "
        "n=$((n+1)); done\n"
        # KILL until nothing is left (a process forking as fast as it can is caught next time)
        "n=0; while alive && [ $n -lt 10 ]; do hit KILL; sleep 0.1; n=$((n+1)); done\n"
        '[ -z "$g" ] || [ -f "$d/exit" ] || { echo 137 > "$d/exit.tmp" && mv "$d/exit.tmp" '
        '"$d/exit"; }\n'
        "echo killed\n"
    )
    return _sh(pool, node, script, timeout=grace_s + pool.command_timeout, owner=owner).strip()


def signal(pool: NodeAccess, node: str, job_id: int, name: str,
           owner: str | None = None) -> bool:
    """Send signal ``name`` (one of ``jobs.SIGNALS``) once to each of the job's processes: its
    process group, and every process tagged with it outside that group (see ``cancel``); the
    wrapper survives it (its trap). True if anything of the job was there to get it."""
    if name.removeprefix("B:") not in SIGNALS:
        raise InputError(f"cannot send signal {name[:20]!r}", hint=f"one of {', '.join(SIGNALS)}")
    if name.startswith("B:"):   # sbatch's --signal=B:SIG: the batch script alone
        return _send_batch(pool, node, job_id, name[2:], owner)
    return _send(pool, node, job_id, name, owner)


def _send_batch(pool: NodeAccess, node: str, job_id: int, name: str, owner: str | None
                ) -> bool:
    """Send ``name`` to the job's batch script alone (sbatch's ``--signal=B:SIG``): the
    wrapper's (the recorded session leader's) own children, not what the script started."""
    script = (
        _find_job(pool, node, job_id) +
        'sent=0; [ -n "$g" ] || { echo 0; exit 0; }\n'
        'for s in /proc/[0-9]*/stat; do l=$(cat "$s" 2>/dev/null) || continue\n'
        '  set -- ${l##*) }; [ "$2" = "$g" ] || continue\n'
        f'  x=${{s#/proc/}}; kill -{name} "${{x%/stat}}" 2>/dev/null && sent=1; done\n'
        'echo $sent\n'
    )
    return _sh(pool, node, script, owner=owner).strip() == "1"


def _send(pool: NodeAccess, node: str, job_id: int, name: str, owner: str | None) -> bool:
    """Send ``name`` once to each of the job's processes (``signal`` and ``pause``): its
    process group, and every process tagged with it outside that group. True if anything of
    the job was there to get it."""
    script = (
        _find_job(pool, node, job_id) +
        't=$(tagged); sent=0\n'
        f'[ -n "$g" ] && kill -{name} "-$g" 2>/dev/null && sent=1\n'
        # tagged processes outside the group (their own session) get it too, but only once:
        # a signal twice in a row may reach a handler twice
        "for x in $t; do pg=$(sed 's/.*) //' \"/proc/$x/stat\" 2>/dev/null | cut -d' ' -f3)\n"
        f'  [ "$pg" = "$g" ] || {{ kill -{name} "$x" 2>/dev/null && sent=1; }}; done\n'
        'echo $sent\n'
    )
    return _sh(pool, node, script, owner=owner).strip() == "1"


def pause(pool: NodeAccess, node: str, job_id: int, stop: bool,
          owner: str | None = None) -> bool:
    """Suspend (``stop``: SIGSTOP) or resume (SIGCONT) every process of the job, as ``signal``
    reaches them: its process group and every process tagged with it outside the group.  Run
    as the job's owner on a ``run_as: submitter`` node, like every job-touching script.  Both
    are idempotent, so the controller may repeat either after a crash.  STOP and CONT are not
    in ``jobs.SIGNALS``: users cannot ask for them, only run-time adaptation sends them.
    True if anything of the job was there to get it."""
    return _send(pool, node, job_id, "STOP" if stop else "CONT", owner)


def reconcile(pool: NodeAccess, node: str, job_ids: Sequence[int] | Expect,
              owner: str | None = None) -> dict[int, RemoteJob]:
    """What each job's session and directory on the node say now, in one round trip (the
    controller gets the same from every poll; see ``jobstate.state_script`` for the rules).

    ``job_ids``: ids, or (id, recorded pid, recorded start time) triples.
    """
    if not job_ids:
        return {}
    expect = [j if isinstance(j, tuple) else (int(j), None, None) for j in job_ids]
    out = _sh(pool, node, state_script(workdir(pool, node), expect), owner=owner)
    return dict(parse_states(split_sections(out).get("state", (None, ""))[1]))


def read_log(pool: NodeAccess, node: str, job_id: int, offset: int = 0,
             max_bytes: int = 65536, owner: str | None = None, job: Job | None = None,
             stream: str = "output") -> LogBytes:
    """Up to ``max_bytes`` (at most MAX_LOG_READ) of the job's log from ``offset``: with
    ``job``, its ``stream`` ("output": --output or the log; "error": --error), see
    ``stream_path``.

    The log is the job's to shape: a FIFO, a link to /dev/zero or a directory there is refused
    (see the connection's ``read``), and the caller chooses how much to read only up to the cap,
    so no request keeps the controller busy for long. An --output file is read the same way,
    as whoever the job runs as, so naming one gives its owner nothing they could not read.
    """
    if offset < 0 or max_bytes <= 0:
        raise InputError(f"invalid log range offset={offset} max_bytes={max_bytes}",
                         hint="offset must be >= 0 and max_bytes > 0")
    path = f"{job_dir(workdir(pool, node), job_id)}/log" if job is None else \
        stream_path(pool, node, job, stream)
    got = read_node_file(pool, node, path, offset, min(max_bytes, MAX_LOG_READ), owner)
    return log_bytes(got, job_id, node, path, offset, stream)



def read_progress(pool: NodeAccess, node: str, job: Job, offset: int, max_bytes: int
                  ) -> tuple[bytes, int] | None:
    """(up to ``max_bytes`` of the job's progress file from ``offset``, its size), None if
    there is none: its job directory's ``progress`` over SFTP as the SSH account, or on a
    submitter node read by the owner (so a link the owner put there reaches only what the
    owner may read)."""
    return read_node_file(pool, node, f"{job_dir(workdir(pool, node), job.id)}/progress",
                          offset, max_bytes, job.owner)


def read_node_file(pool: NodeAccess, node: str, path: str, offset: int, max_bytes: int,
                   owner: str | None = None) -> tuple[bytes, int] | None:
    """Up to ``max_bytes`` of ``path`` on the node from ``offset`` and its size (a job's
    --output file, its progress), None if there is none: see ``read_progress``."""
    if not pool.node(node).submitter:
        return pool.connection(node).read(path, offset, max_bytes)
    # As the owner, never blocking and never through a link: dd opens it O_NONBLOCK|O_NOFOLLOW
    # (a FIFO swapped in after the check returns at once), and what was read counts only if
    # the same regular file of the owner's is there before and after.
    f = remote_path(path)
    to = f"timeout -k 1 {float(pool.command_timeout):g}"
    out = _sh(pool, node,
              f"f={f}; t=''; command -v timeout >/dev/null 2>&1 && t='{to}'\n"
              'set -- $(stat -c "%f %u %d:%i %s" -- "$f" 2>/dev/null)\n'
              '[ $# = 4 ] || { [ -e "$f" ] || [ -h "$f" ] || { echo missing; exit 0; }\n'
              '  echo "$f cannot be read" >&2; exit 3; }\n'
              '[ $((0x$1 & 61440)) = 32768 ] || { echo "$f is not a regular file" >&2; exit 3; }\n'
              '[ "$2" = "$(id -u)" ] || { echo "$f is not $(id -un)\'s own file" >&2; exit 3; }\n'
              'echo "size $4"\n'
              f'$t dd if="$f" iflag=nonblock,nofollow,skip_bytes,count_bytes skip={int(offset)} '
              f'count={int(max_bytes)} bs=65536 status=none | base64 | tr -d "\\n"; echo\n'
              '[ "$(stat -c "%f %u %d:%i" -- "$f" 2>/dev/null)" = "$1 $2 $3" ] || '
              '{ echo "$f was replaced while it was read" >&2; exit 3; }\n', owner=owner)
    lines = out.splitlines()
    if not lines or lines[0] == "missing":
        return None
    try:
        size = int(lines[0].split()[1])
        data = base64.b64decode("".join(lines[1:2]), validate=True)
    except (IndexError, ValueError):
        raise NodeError(f"node {node}: unreadable answer reading {path}") from None
    return data, max(size, offset + len(data))


def set_aside(pool: NodeAccess, node: str, job_id: int, suffix: str,
              owner: str | None = None) -> None:
    """Rename a job's directory to ``{id}.{suffix}.{time}.{n}`` (kept for its log) so a new
    attempt of the same job on this node starts fresh instead of finding the old pid file."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", suffix):
        raise InputError(f"bad directory suffix {suffix!r}")
    d = job_dir(workdir(pool, node), job_id)
    _sh(pool, node, f'd={remote_path(d)}; [ -d "$d" ] || exit 0; '
                    f'mv "$d" "$d.{suffix}.$(date +%s).$$"', owner=owner)


def clean_finished(pool: NodeAccess, node: str, job_ids: Sequence[int],
                   owner: str | None = None) -> None:
    """Remove finished jobs' directories on the node, with their set-aside ``ID.*`` siblings
    (the controller calls this once a job is past ``lab.job_dir_retention``).

    Only names made here from integer ids, inside the node's jobs directory, are touched, and
    never through a symlink (a job may have replaced its directory or the jobs directory with
    one); what a job made unwritable is made writable first so its removal cannot fail forever.
    """
    if any(isinstance(j, bool) or not isinstance(j, int) or j < 0 for j in job_ids):
        raise InputError(f"clean_finished: job ids must be integers >= 0, got {list(job_ids)}")
    if not job_ids:
        return
    jobs = remote_path(workdir(pool, node).rstrip("/") + "/jobs")
    _sh(pool, node,
        f"j={jobs}; [ -d \"$j\" ] || exit 0\n"
        '[ -h "$j" ] && { echo "$j is a symbolic link; not cleaning there" >&2; exit 1; }\n'
        'cd "$j" || exit 1\n'
        f"for i in {' '.join(map(str, job_ids))}; do for x in \"$i\" \"$i\".*; do\n"
        '  if [ -h "$x" ]; then rm -f -- "$x"; elif [ -e "$x" ]; then\n'
        '    chmod -R u+rwx -- "$x" 2>/dev/null; rm -rf -- "$x" || exit 1; fi\n'
        "done; done\n", owner=owner)

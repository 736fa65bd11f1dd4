"""`iadeep queue ...`: submit, list, inspect and control jobs (through the controller)."""
from __future__ import annotations

import difflib
import os
import pwd
import re
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path

import typer

# typer >= 0.26 ships its own copy of click (see cli/errors.py)
from typer._click.core import ParameterSource
from typer._click.exceptions import MissingParameter, UsageError

from ..errors import InputError
from ..jobopts import (
    DIRECTIVE,
    EXPORT_DEFAULT,
    MAX_DIRECTIVE_SCAN,
    directives,
    exported_env,
    parse_names,
)
from ..jobs import (
    JobSpec,
    JobState,
    SubmitSpec,
    check_interpreter,
    parse_env,
    parse_idle_after,
    parse_job_ids,
    parse_time_limit,
    validate_spec,
)
from ..paths import file_problem
from ..text import (
    clock,
    column_widths,
    duration,
    field_text,
    forecast_text,
    hms,
    job_label,
    moment,
    newest_runs,
    shorten,
    when,
)
from . import complete, render
from .errors import report
from .lazy import client, messages as m

app = typer.Typer(help="Submit, list and control jobs.", no_args_is_help=True)



def _refs(value: str | list[str]) -> str | list[str]:
    """Checks job references as the command line is parsed, so that one that is not a job id
    is a usage error (exit 2) like any ill-typed value."""
    for text in [value] if isinstance(value, str) else value:
        try:
            _job_ref(text)
        except InputError as exc:
            raise typer.BadParameter(f"{exc.message} ({exc.hint})") from None
    return value


IDS = typer.Argument(..., help="One or more job ids; an array's id means all its tasks, "
                     "ID_INDEX (12_3) one task.", callback=_refs, autocompletion=complete.job_ids)
JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _script_path(script: str) -> str:
    path = Path(script).expanduser()
    problem = file_problem(path)
    if problem:
        raise InputError(f"script {script!r} {problem}",
                         hint="give the path of an executable job script, e.g. jobs/hello.sh")
    if not os.access(path, os.R_OK):
        raise InputError(f"script {script!r} is not readable", hint=f"chmod a+r {script}")
    check_interpreter(path)
    return str(path.resolve())


@app.command("add")
def add(
    ctx: typer.Context,
    script: str | None = typer.Argument(None, help="Job script to run (copied to the node; "
                                        "its #IADEEP lines are options). Or --wrap."),
    args: list[str] | None = typer.Argument(None, help="Arguments for the script; put "
                                            "options meant for the script after `--`."),
    gpus: int = typer.Option(1, "--gpus", "-g", help="GPUs the job needs (on one node)."),
    mem: float | None = typer.Option(None, "--mem", help="GPU memory per GPU, GiB."),
    name: str = typer.Option("", "--name", "-n", "--job-name", "-J",
                             help="A name to recognise it by."),
    workload: str | None = typer.Option(None, "--workload", "-w",
                                        help="Profile label (see `iadeep profile list`).",
                                        autocompletion=complete.workloads),
    new_workload: bool = typer.Option(False, "--new-workload",
                                      help="--workload is a new label, though close to a "
                                           "known one (it is profiled on its first run)."),
    priority: int = typer.Option(0, "--priority", "-p", help="Higher runs first."),
    exclusive: bool = typer.Option(False, "--exclusive", help="Never share its GPUs."),
    workdir: str | None = typer.Option(None, "--chdir", "-D", "--workdir", metavar="DIR",
                                       help="Working directory on the node (relative: to "
                                            "here). Default: this directory where the node "
                                            "shares it (shared_paths), else the job's own."),
    env: list[str] | None = typer.Option(None, "--env", "-e", help="NAME=VALUE, repeatable."),
    retries: int | None = typer.Option(None, "--retries",
                                       help="Requeue this often if its node is lost "
                                            "(default: the lab's default_retries)."),
    min_speed: float | None = typer.Option(None, "--min-speed",
                                           help="Lowest predicted speed accepted when "
                                                "sharing (0-1]; default from the lab."),
    time: str | None = typer.Option(None, "--time", "-t", metavar="LIMIT",
                                    help="Stop it once it has run this long, as sbatch writes "
                                         "it: 90 (minutes), 2:00:00, 3-0 (days-hours)."),
    signal: str | None = typer.Option(None, "--signal", metavar="SIG[@SECONDS]",
                                      help="Send SIG (e.g. USR1) SECONDS (default 60) before "
                                           "the time limit, to checkpoint."),
    notify: str | None = typer.Option(None, "--notify", metavar="WHEN",
                                      help="Send a message (e-mail, webhook: the lab's "
                                           "channels) when it ends (end), ends other than "
                                           "succeeded (fail), starts and ends (all), or never "
                                           "(none); default: the lab's lab.notify.default."),
    wrap: str | None = typer.Option(None, "--wrap", metavar="CMD",
                                    help="Run this shell command instead of a script."),
    export: str | None = typer.Option(None, "--export", metavar="NONE|ALL|NAME[,NAME...]",
                                      help="Variables of this shell the job gets (default: "
                                           + ", ".join(EXPORT_DEFAULT) + "); --env wins."),
    output: str | None = typer.Option(None, "--output", "-o", metavar="FILE",
                                      help="Its stdout (and stderr without --error) into FILE "
                                           "on the node, relative to its working directory; "
                                           "%j: job id, %u: user, %x: name."),
    error: str | None = typer.Option(None, "--error", metavar="FILE",
                                     help="Its stderr into FILE (as --output); "
                                          "`iadeep logs ID --stderr` reads it."),
    constraint: str | None = typer.Option(None, "--constraint", "-C", metavar="LABEL[&LABEL]",
                                          help="Only on nodes with all these labels (labels: "
                                               "in nodes.yaml)."),
    nodelist: str | None = typer.Option(None, "--nodelist", metavar="NODE[,NODE]",
                                        help="Only on one of these nodes."),
    exclude: str | None = typer.Option(None, "--exclude", "-x", metavar="NODE[,NODE]",
                                       help="Never on these nodes."),
    after: str | None = typer.Option(None, "--after", metavar="ID[,ID...]",
                                     help="Start only once these jobs succeeded (cancelled if "
                                          "one ends otherwise); an array's id: all its tasks."),
    after_any: str | None = typer.Option(None, "--after-any", metavar="ID[,ID...]",
                                         help="Start once these jobs ended, in any state."),
    after_fail: str | None = typer.Option(None, "--after-fail", metavar="ID[,ID...]",
                                          help="Start only once these jobs ended other than "
                                               "succeeded (cancelled if one succeeds)."),
    array: str | None = typer.Option(None, "--array", metavar="INDICES[%N]",
                                     help="One task per index: 0-99, 1,3,5, 0-99:2; %8 runs "
                                          "at most 8 at once. Each gets IADEEP_ARRAY_INDEX."),
    retry_on_fail: bool = typer.Option(False, "--retry-on-fail",
                                       help="--retries also after a non-zero exit code."),
    checkpoint_signal: str | None = typer.Option(
        None, "--checkpoint-signal", metavar="SIG",
        help="The job saves a checkpoint and exits on SIG: when its shared GPU runs worse than "
             "serial it gets SIG instead of being suspended, and is requeued to resume from "
             "its checkpoint in the same working directory (docs/scheduling.md 'Adapting at "
             "run time')."),
    opportunistic: bool = typer.Option(
        False, "--opportunistic",
        help="Use spare GPUs; suspended (or checkpointed) first when a regular job waits for "
             "its GPU, resumed when that job leaves (docs/scheduling.md 'Adapting at run time')."),
    idle_after: str | None = typer.Option(
        None, "--idle-after", metavar="DURATION",
        help="Count this job as idle once its GPUs sat idle this long (e.g. 2h; a bare number "
             "is minutes), instead of the lab's idle_after (docs/administration.md)."),
    no_adapt: bool = typer.Option(False, "--no-adapt",
                                  help="Never suspend this job when its shared GPU runs worse "
                                       "than serial (docs/scheduling.md 'Adapting at run time')."),
    # sbatch's own spellings, with sbatch's meaning (docs/submitting.md "Coming from Slurm")
    requeue: bool | None = typer.Option(None, "--requeue/--no-requeue",
                                        help="It may be requeued: it checkpoints on its "
                                             "--checkpoint-signal (USR1 by default) and starts "
                                             "again (sbatch's --requeue)."),
    test_only: bool = typer.Option(False, "--test-only",
                                   help="Queue nothing: say whether, where and when the job "
                                        "would start (sbatch's --test-only)."),
) -> None:
    """Queue SCRIPT (or --wrap CMD) to run on GPUs; prints the new job's id. Options may also
    be given on #IADEEP lines at the top of the script (the command line wins), as #SBATCH."""
    o = dict(locals())
    del o["ctx"]
    if script is None and wrap is None:   # a usage error (exit 2), as before --wrap
        param = next(p for p in ctx.command.params if p.name == "script")
        raise MissingParameter(ctx=ctx, param=param)
    content, path = _job_script(o["script"], o["wrap"], o["args"])
    if o["wrap"] is None:
        o = _with_directives(ctx, o, path, content)
    request = submission(o, content, path, "wrap" if o["wrap"] is not None else "")
    if o["test_only"]:
        print(trial_text(client.ask(m.TrialRequest(request))))
        return
    print(client.submit(request, content).id)


def trial_text(got: m.TrialResult, now: float | None = None) -> str:
    """``queue add --test-only``'s answer: would it start now, where; else why it would wait
    and when it is expected to start."""
    now = time.time() if now is None else now
    f = got.forecast
    where = f"{f.node}:{','.join(str(i) for i in f.gpus)}" if f is not None and f.node else ""
    if got.now:
        beside = ""
        if f is not None and f.beside:
            beside = " beside job" + ("s " if len(f.beside) > 1 else " ") + \
                ", ".join(str(i) for i in f.beside)
            beside += f" at ~{f.speed:.1f}x" if f.speed is not None else ""
        return f"the job would start now on {where}{beside} (test only: nothing queued)"
    lines = [f"the job would wait: {got.reason}" if got.reason else "the job would wait"]
    if f is not None:
        lines.append(forecast_text(f.start, f.start_low, f.start_high, f.end, now,
                                   where=where, beside=f.beside, speed=f.speed))
    lines.append("(test only: nothing queued)")
    return "\n".join(lines)


# `queue add`'s options that are not the script: `iadeep run` takes them too (cli/run.py);
# --test-only is `queue add`'s alone.
SCRIPT_PARAMS = ("ctx", "script", "args", "wrap", "test_only")


def submission(o: dict, content: bytes, path: str, default_name: str = "") -> SubmitSpec:
    """The AddRequest spec of `queue add`'s options ``o`` (by parameter name) for the job
    script ``content`` at ``path``; checks it and the workload label first (InputError)."""
    spec = JobSpec(script=path, args=tuple(o.get("args") or ()),
                   name=o["name"] or default_name, gpus=o["gpus"],
                   mem_gib=o["mem"], workload=o["workload"], priority=o["priority"],
                   exclusive=o["exclusive"], workdir=_chdir(o["workdir"]),
                   env=parse_env(o["env"] or ()), min_speed=o["min_speed"],
                   time_limit_s=None if o["time"] is None else parse_time_limit(o["time"]),
                   signal=o["signal"], submit_dir=_here(),
                   output=o["output"], error=o["error"],
                   constraint=() if o["constraint"] is None else
                   parse_names("--constraint", o["constraint"], "&"),
                   nodelist=() if o["nodelist"] is None else
                   parse_names("--nodelist", o["nodelist"]),
                   exclude=() if o["exclude"] is None else parse_names("--exclude", o["exclude"]),
                   exported=_exported(o["export"]),
                   after=_ids(o["after"], "--after"),
                   after_any=_ids(o["after_any"], "--after-any"),
                   after_fail=_ids(o["after_fail"], "--after-fail"), array=o["array"],
                   retry_on_fail=o["retry_on_fail"], no_adapt=o["no_adapt"],
                   checkpoint_signal=o["checkpoint_signal"], opportunistic=o["opportunistic"],
                   idle_after_s=None if o["idle_after"] is None else
                   parse_idle_after(o["idle_after"]),
                   requeue=bool(o["requeue"]))
    # --retries and --notify not given: the controller applies the lab's defaults
    submitted = SubmitSpec.of(spec, retries=o["retries"], notify=o["notify"])
    validate_spec(submitted.spec)
    if o["workload"] and not o["new_workload"]:
        _check_workload(o["workload"])
    return submitted


WRAP_PATH = "wrap.sh"


def _job_script(script: str | None, wrap: str | None, args: list[str] | None
                ) -> tuple[bytes, str]:
    """The job script's content and absolute path: the file given, or for ``--wrap CMD`` a
    two-line sh script (as sbatch --wrap), named ``wrap.sh`` in the submission directory (a
    name only: it is sent, never written)."""
    if wrap is None:
        if script is None:
            raise InputError("no job script given", hint="iadeep queue add SCRIPT [ARGS...], "
                             "or iadeep queue add --wrap 'python train.py'")
        path = _script_path(script)
        content = Path(path).read_bytes()
        _check_line_endings(path, content)
        return content, path
    if script is not None or args:
        raise InputError("--wrap takes the whole command; give a script or --wrap, not both",
                         hint="e.g. iadeep queue add --wrap 'python train.py --lr 3'")
    if not wrap.strip():
        raise InputError("--wrap needs a command", hint="e.g. --wrap 'python train.py'")
    return f"#!/bin/sh\n{wrap}\n".encode(), os.path.join(_here() or "/", WRAP_PATH)


def _check_line_endings(path: str, content: bytes) -> None:
    """A ``#!`` line ending in CR (a script saved with Windows line endings) names an
    interpreter that does not exist (``/bin/sh\r``): the job would fail on its node."""
    first = content.split(b"\n", 1)[0]
    if first.startswith(b"#!") and first.endswith(b"\r"):
        raise InputError(f"{path}: its #! line ends in a carriage return (Windows line "
                         "endings), so the node would not find its interpreter",
                         hint=f"convert the file: sed -i 's/\\r$//' {shlex.quote(path)} "
                              "(or dos2unix)")


def _here() -> str | None:
    """The submission directory (None if it was removed under the shell)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _chdir(path: str | None) -> str | None:
    """--chdir as sbatch takes it: a relative path starts at the submission directory; an
    absolute one or ``~/...`` (the node's home) is kept."""
    if path is None or path.startswith(("/", "~")):
        return path
    here = _here()
    if here is None:
        raise InputError(f"--chdir {path!r} is relative, and this shell's directory is gone",
                         hint="give an absolute path")
    return os.path.normpath(os.path.join(here, path))


def _exported(mode: str | None) -> tuple[tuple[str, str], ...]:
    pairs, skipped = exported_env(mode, os.environ)
    if skipped:
        print(f"note: --export ALL left out {', '.join(skipped)} (control characters in the "
              "value, or a variable that changes how programs load: set it in the job script)",
              file=sys.stderr)
    return pairs


def _with_directives(ctx: typer.Context, given: dict, path: str, content: bytes) -> dict:
    """``given`` (this command's options) with the script's #IADEEP lines filled in where the
    command line does not set an option, as sbatch does with #SBATCH (--env adds to them).
    Each line is parsed as this command's options; one it does not take is an error naming
    the script's line."""
    text = content[:MAX_DIRECTIVE_SCAN].decode("utf-8", "replace")
    try:
        lines = directives(text)
    except InputError as exc:   # names the line: add the file
        raise InputError(f"{path}: {exc.message}", hint=exc.hint) from None
    if not lines:
        _sbatch_note(path, text)
        return given
    command = ctx.command
    from_lines: dict = {}
    for number, words in lines:
        where = f"{path}:{number}: #IADEEP {shlex.join(words)}"
        try:
            with command.make_context(ctx.info_name, ["-", *words],
                                      parent=ctx.parent) as sub:
                pass
        except UsageError as exc:
            raise InputError(f"{where}: {exc.format_message()}",
                             hint="#IADEEP lines take `iadeep queue add` options, e.g. "
                                  "#IADEEP --gpus 2 --time 2:00:00") from None
        if sub.params.get("script") != "-" or sub.params.get("args"):
            raise InputError(f"{where}: only options go on #IADEEP lines",
                             hint="arguments for the script go on the command line")
        for key, value in sub.params.items():
            if key in ("script", "args", "wrap") or \
                    sub.get_parameter_source(key) != ParameterSource.COMMANDLINE:
                continue
            if key == "env":
                from_lines[key] = [*from_lines.get(key, []), *value]
            else:
                from_lines[key] = value
    out = dict(given)
    for key, value in from_lines.items():
        if ctx.get_parameter_source(key) != ParameterSource.COMMANDLINE:
            out[key] = value
        elif key == "env":   # both: the command line's come last, and win on the node
            out[key] = [*value, *(given[key] or ())]
    return out


# sbatch options with an `iadeep queue add` equivalent of the same meaning (sbatch's -e, -w,
# -p, -n differ from iadeep's: they are mapped by meaning, never by spelling).
SBATCH_SAME = {"-J": "--job-name", "--job-name": "--job-name", "-t": "--time",
               "--time": "--time", "-D": "--chdir", "--chdir": "--chdir", "-o": "--output",
               "--output": "--output", "-e": "--error", "--error": "--error",
               "-C": "--constraint", "--constraint": "--constraint", "-w": "--nodelist",
               "--nodelist": "--nodelist", "-x": "--exclude", "--exclude": "--exclude",
               "-a": "--array", "--array": "--array", "--export": "--export",
               "-G": "--gpus", "--gpus": "--gpus", "--gpus-per-node": "--gpus",
               "--exclusive": "--exclusive"}


def _sbatch_equivalent(words: list[str]) -> str | None:
    """``#SBATCH WORDS`` as an ``#IADEEP`` line, or None where iadeep has no equivalent."""
    if not words or not words[0].startswith("-"):
        return None
    opt, eq, value = words[0].partition("=")
    rest = words[1:]
    if not eq and len(opt) > 2 and not opt.startswith("--"):      # -t2:00:00
        opt, value, eq = opt[:2], opt[2:], "="
    if opt == "--gres":
        gpus = re.fullmatch(r"gpu(?::[\w.-]+)?:(\d+)", value if eq else (rest or [""])[0])
        return f"#IADEEP --gpus {gpus.group(1)}" if gpus else None
    if opt not in SBATCH_SAME or len(rest) > (0 if eq or opt == "--exclusive" else 1):
        return None
    args = [value] if eq else rest
    return f"{DIRECTIVE} {shlex.join([SBATCH_SAME[opt], *args])}"


def _sbatch_note(path: str, text: str) -> None:
    """A script with #SBATCH lines and no #IADEEP line expects them read: warn that iadeep
    does not, naming each one's #IADEEP equivalent (or that it has none)."""
    try:
        found = directives(text.replace("#SBATCH", DIRECTIVE))   # same length, same rules
    except InputError:
        return
    if not found:
        return
    said = []
    for number, words in found:
        equivalent = _sbatch_equivalent(words)
        said.append(f"line {number}: {equivalent}" if equivalent else
                    f"line {number}: no equivalent for {shlex.join(words)}")
    print(f"warning: {path} has #SBATCH lines, which iadeep does not read; as #IADEEP lines: "
          + "; ".join(said), file=sys.stderr)


def _ids(text: str | None, option: str) -> tuple[int, ...]:
    return () if text is None else parse_job_ids(text, option)


@app.command("rerun")
def rerun(job_id: str = typer.Argument(..., help="A finished job's id (or ID_INDEX).",
                                        callback=_refs, autocompletion=complete.job_ids)) -> None:
    """Submit a finished job again with the same spec; prints the new job's id."""
    request = m.RerunRequest(_job_id(job_id), token=uuid.uuid4().hex)
    print(client.ask(request, retry_lost=True).id)


def _check_workload(label: str) -> None:
    """Refuse a --workload label that is not known but close to one that is (a typo would
    silently start a new workload, profiled from scratch and never sharing until then)."""
    views, _ = client.read(m.ProfilesRequest())
    known = [v.profile.workload for v in views]
    if label in known:
        return
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(label.lower(), list(by_lower), n=1, cutoff=0.85)
    if close:
        raise InputError(f"unknown workload {label!r}; did you mean {by_lower[close[0]]!r}?",
                         hint="`iadeep profile list` shows the known labels; pass "
                              "--new-workload to start a new one")


LIST_HEADERS = ["ID", "NAME", "USER", "STATE", "GPUS", "WHERE", "AGE", "REASON"]


@app.command("list")
def list_(
    all_: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    owner: str | None = typer.Option(None, "--user", "-u", help="Only this user's jobs."),
    wide: bool = typer.Option(False, "--wide", help="Never shorten NAME and REASON (they are "
                              "shortened only on a terminal)."),
    limit: int | None = typer.Option(None, "--limit", "-n", help="Only the newest N jobs "
                                     "(--all: 1000 unless given)."),
    before: int | None = typer.Option(None, "--before", help="Only jobs with ids below this "
                                      "(the next page back)."),
    json_: bool = JSON,
) -> None:
    """List unfinished jobs (all with --all: the newest 1000, --before ID for older ones)."""
    request = m.ListRequest(all_states=all_, owner=owner, limit=limit, before=before)
    shown, _ = request.page()
    jobs, stale = client.read(request)
    if shown is not None and len(jobs) >= shown and jobs:
        print(f"note: showing the newest {len(jobs)} jobs; older ones: --before {jobs[0].id}",
              file=sys.stderr)
    if json_:
        render.as_json(m.encode(jobs))
        return
    render.stale_note(stale)
    now = time.time()
    folded = _fold(jobs)
    rows = [[label, j.name, j.owner, j.state.value, str(j.gpus), _where(j),
             duration(now - j.submitted_at), _reason(j)] for label, j in folded]
    jobs = [j for _, j in folded]
    headers = LIST_HEADERS
    if any(j.time_limit_s is not None for j in jobs):   # only where some job has a limit
        headers = [*headers[:-1], "TIME", headers[-1]]
        rows = [[*r[:-1], _time_used(j, now), r[-1]] for r, j in zip(rows, jobs)]
    if wide and any(j.expected_start is not None for j in jobs):   # the controller's forecast
        headers = [*headers[:-1], "EXPECTED START", headers[-1]]
        rows = [[*r[:-1], _expected(j, now), r[-1]] for r, j in zip(rows, jobs)]
    if sys.stdout.isatty() and not wide:
        rows = _fit(headers, rows, shutil.get_terminal_size().columns)
    render.table(headers, rows)


def _expected(job: m.JobView, now: float) -> str:
    """A waiting job's expected start as ``queue list --wide`` shows it: ``~14:20`` ('-' where
    the controller has no forecast for it)."""
    if job.expected_start is None:
        return "-"
    return "~" + moment(max(job.expected_start, now), now)


def _reason(job: m.JobView) -> str:
    """A job's reason as the list shows it: a waiting job that was preempted (or requeued on
    request) says so before why it waits now."""
    if job.preempted and job.state in (JobState.QUEUED, JobState.HELD):
        return f"{job.preempted}; {job.reason}" if job.reason else job.preempted
    return job.reason


def _fold(jobs: list[m.JobView]) -> list[tuple[str, m.JobView]]:
    """(ID as shown, job) per line: an array's task reads ARRAY_INDEX (12_3), as in Slurm (an
    earlier run of a task run again: its own id, ``text.job_label``), and its queued tasks
    fold into one line where the first of them was (12_[3-5,9]), so a thousand-task array
    takes one line while it waits."""
    queued: dict[int, list[m.JobView]] = {}
    for j in jobs:
        if j.array_id is not None and j.state == JobState.QUEUED:
            queued.setdefault(j.array_id, []).append(j)
    out: list[tuple[str, m.JobView]] = []
    newest = newest_runs(jobs)
    for j in jobs:
        if j.array_id is None:
            out.append((str(j.id), j))
        elif j.state != JobState.QUEUED or len(queued[j.array_id]) == 1:
            out.append((job_label(j, newest), j))
        elif queued[j.array_id][0] is j:
            indices = [t.array_index for t in queued[j.array_id] if t.array_index is not None]
            out.append((f"{j.array_id}_[{_ranges(indices)}]", j))
    return out


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``0-2,5,7-8``."""
    runs: list[list[int]] = []   # [first, last] of each run of consecutive indices
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _job_ref(text: str) -> tuple[int, int | None]:
    """A job named on the command line: ``12`` (a job, or an array: all its tasks) or
    ``12_3`` (task 3 of array 12): (id, index or None)."""
    first, sep, index = text.strip().partition("_")
    if not first.isdigit() or (sep and not index.isdigit()):
        raise InputError(f"{text[:40]!r} is not a job id", hint="e.g. 12, or 12_3 for task 3 of "
                         "array 12")
    return int(first), (int(index) if sep else None)


def _job_id(text: str) -> int:
    """The id of the job ``text`` names (a task's own id for ``12_3``: its newest run)."""
    job_id, index = _job_ref(text)
    if index is None:
        return job_id
    jobs, _ = client.read(m.ListRequest(all_states=True, limit=m.LIST_MAX))
    found = [j.id for j in jobs if j.array_id == job_id and j.array_index == index]
    if not found:
        raise InputError(f"array {job_id} has no task {index}",
                         hint="`iadeep queue list --all` shows the array's tasks")
    return found[-1]


def _jobs_request(kind: type[m.JobsRequest], refs: list[str]) -> m.JobsRequest:
    parsed = [_job_ref(r) for r in refs]
    return kind(tuple(i for i, x in parsed if x is None),
                tasks=tuple((i, x) for i, x in parsed if x is not None))


def _time_used(job: m.JobView, now: float) -> str:
    """This attempt's run time so far (or in all, once ended) over its limit: ``12m/2:00:00``."""
    began = job.started_at
    used = "-" if began is None else duration((job.ended_at or now) - began)
    return used if job.time_limit_s is None else f"{used}/{hms(job.time_limit_s)}"


def _fit(headers: list[str], rows: list[list[str]], columns: int) -> list[list[str]]:
    """One job a line on a terminal ``columns`` wide: NAME and REASON as wide as they are where
    the terminal has room, else NAME cut to 28 characters first, then REASON to the rest of the
    line (at least 20), then NAME further, each marked "..." (``text.column_widths``, as the
    monitor does). A pipe gets them whole, so grep finds them."""
    last = len(headers) - 1
    widths = column_widths(headers, rows, columns, [(1, 28), (last, 20), (1, 12)])
    return [[r[0], shorten(r[1], widths[1]), *r[2:-1], shorten(r[-1], widths[-1])] for r in rows]


def _where(job: m.JobView) -> str:
    if not job.node:
        return "-"
    return f"{job.node}:{','.join(str(i) for i in job.gpu_indices)}"


SHOW_FIELDS = ("id", "name", "owner", "state", "reason", "script", "args", "workdir", "env",
               "gpus", "mem_gib", "workload", "priority", "exclusive", "retries", "time_limit_s",
               "signal", "notify", "attempts", "node", "gpu_indices", "remote_pid", "exit_code",
               "predicted_speed", "observed_speed",
               # submitting like sbatch (--chdir's default, --export, --output/--error, nodes)
               "submit_dir", "exported", "output", "error", "constraint", "nodelist", "exclude")
# Shown only on the jobs that have them (dependencies, arrays, reruns).
SHOW_IF_SET = ("after", "after_any", "after_fail", "array", "array_id", "array_index",
               "retry_on_fail", "rerun_of", "no_adapt", "suspended_s", "checkpoint_signal",
               "checkpoints", "opportunistic", "requeue", "requeueing", "preempted")


_field = field_text   # the monitor's details pane shows fields the same way


@app.command("show")
def show(job_id: str = typer.Argument(..., help="Job id (or ID_INDEX).", callback=_refs,
                                      autocompletion=complete.job_ids),
         json_: bool = JSON) -> None:
    """Show a job's fields and its event history."""
    detail, stale = client.read(m.ShowRequest(_job_id(job_id)))
    if json_:
        render.as_json(m.encode(detail))
        return
    render.stale_note(stale)
    detail = render.clean(detail)
    job = detail.job
    for name in SHOW_FIELDS:   # labelled as in the JSON (a job's owner is its "user")
        value = _field(name, getattr(job, name))
        if name == "submit_dir" and job.submit_dir and job.workdir is None:
            # which one: the events (and `queue why`) say once it runs
            value += " (the working directory where its node shares it, else its job directory)"
        print(f"{m.JobView.key(name):>16}: {value}")
        if name == "attempts" and job.attempts:   # which try this is, of how many allowed
            print(f"{'':>16}  (attempt {job.attempts} of {job.retries + 1})")
    for name in SHOW_IF_SET:
        if getattr(job, name) is not None:
            print(f"{name:>16}: {_field(name, getattr(job, name))}")
    for name in ("submitted_at", "started_at", "ended_at"):
        print(f"{name:>16}: {when(getattr(job, name))}")
    if detail.priority is not None and detail.priority.fairshare_on:   # what it is ranked by
        first, *more = priority_lines(detail.priority, job.owner)
        print(f"{'effective':>16}: {first}")
        for line in more:
            print(f"{'':>16}  {line}")
    print("events:")
    render.table(["TIME", "FROM", "TO", "BY", "REASON"],
                 ([clock(e.at), e.old_state,
                   e.new_state, e.actor, e.reason] for e in detail.events))


@app.command("why")
def why(job_id: str = typer.Argument(..., help="Job id (or ID_INDEX).",
                                    callback=_refs, autocompletion=complete.job_ids)) -> None:
    """Say why a job waits (or what it is doing)."""
    detail, stale = client.read(m.ShowRequest(_job_id(job_id)))
    render.stale_note(stale)
    detail = render.clean(detail)   # the job and its owner's fair-share figures
    job = detail.job
    reason = job.reason or "no reason recorded yet (the scheduler has not looked at it)"
    print(f"job {job.id} is {job.state}: {reason}")
    if job.requeueing and job.state == JobState.RUNNING:
        by = "preempted for" if job.requeueing.startswith("job ") else "requeue asked by"
        print(f"{by} {job.requeueing}: it checkpoints and goes back to the queue")
    elif job.preempted:   # it waits again after a preemption or a requeue on request
        print(job.preempted)
    if detail.runtime is not None:
        print(f"expected run time {runtime_text(detail.runtime, job)}")
    if detail.forecast is not None:
        print(forecast_line(detail.forecast, job))
    # With fair share on, what a waiting job is ranked by, part by part (off: as it always was;
    # `queue show --json` has the parts either way).
    if detail.priority is not None and detail.priority.fairshare_on:
        first, *more = priority_lines(detail.priority, job.owner)
        print(f"effective priority {first}")
        for line in more:
            print(f"  {line}")


def forecast_line(f: m.ForecastView, job: m.JobView, now: float | None = None) -> str:
    """The controller's forecast of a job (docs/submitting.md "When will it start?")."""
    return forecast_text(f.start, f.start_low, f.start_high, f.end, now or time.time(),
                         where=f"{f.node}:{','.join(str(i) for i in f.gpus)}" if f.node else "",
                         beside=f.beside, speed=f.speed,
                         waiting=job.state in (JobState.QUEUED, JobState.HELD))


def runtime_text(r: m.RuntimeView, job: m.JobView) -> str:
    """Placement's run-time estimate as a sentence part: ``~3h00m (1h00m-9h00m, from your
    history of label bert)``: the median, the 10%-90% range, and what it rests on."""
    try:
        me = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        me = ""
    whose = "your" if job.owner == me else f"{job.owner}'s"
    label = f"label {job.workload}" if job.workload else "jobs without a label"
    base, _, rest = r.source.partition(" + ")   # "--time (cap) + label history"
    sources = {"--time": "its --time", "user+label history": f"{whose} history of {label}",
               "user history": f"{whose} history", "label history": f"the lab's history of "
               f"{label}", "lab history": "the lab's history of all jobs",
               "default": "a default: no history to go by yet"}
    said = sources.get(rest or base, rest or base)
    if base == "--time (cap)":
        said += ", capped by its --time"
    return f"~{duration(r.seconds)} ({duration(r.low_s)}-{duration(r.high_s)}, from {said})"


def priority_lines(p: m.PriorityView, owner: str) -> list[str]:
    """A waiting job's effective priority as a sum, then its owner's fair share (docs/scheduling.md
    "Fair share"): ``3.40 = base 0 + aging 0.90 (54m x 1/h) + fair share 2.50``."""
    waited = duration(p.aging / p.aging_per_hour * 3600) if p.aging_per_hour else "-"
    parts = [f"{p.effective:.2f} = base {p.base} + aging {p.aging:.2f} "
             f"({waited} x {p.aging_per_hour:g}/h)"]
    fs = p.fairshare
    if fs is not None:
        parts[0] += f" + fair share {fs.points:.2f}"
        parts.append(f"fair share of {fs.user}: used {fs.usage_gpu_h:.1f} GPU-hours (decayed, "
                     f"half-life {fs.half_life_days:g}d) = {fs.usage_norm:.0%} of all use; "
                     f"share {fs.share:g} = {fs.share_norm:.0%} of the shares; factor "
                     f"2^-({fs.usage_norm:.2f}/{fs.share_norm:.2f}) = {fs.factor:.3f} "
                     f"x weight {fs.weight:g}")
    elif p.fairshare_on:
        parts.append(f"fair share of {owner}: not worked out yet (at the next scheduling "
                     "round)")
    return parts


def _act(request: m.JobsRequest) -> None:
    failed = 0
    for r in client.ask(request):
        if r.error is not None:
            failed += 1
            report(r.error)
        else:
            print(f"job {r.id}: {r.state}")
    if failed:
        raise typer.Exit(1)


@app.command("cancel")
def cancel(ids: list[str] = IDS) -> None:
    """Cancel jobs (queued ones at once; running ones are stopped on their node)."""
    _act(_jobs_request(m.CancelRequest, ids))


@app.command("requeue")
def requeue(ids: list[str] = IDS) -> None:
    """Checkpoint running --requeue jobs and queue them again, without spending a retry (as
    Slurm's `scontrol requeue`): each gets its checkpoint signal, and is stopped if it has not
    exited within the lab's preempt_grace. Your own jobs (an admin: anyone's)."""
    _act(_jobs_request(m.RequeueRequest, ids))


@app.command("hold")
def hold(ids: list[str] = IDS) -> None:
    """Keep queued jobs from starting until released."""
    _act(_jobs_request(m.HoldRequest, ids))


@app.command("release")
def release(ids: list[str] = IDS) -> None:
    """Let held jobs be scheduled again."""
    _act(_jobs_request(m.ReleaseRequest, ids))


# `queue priority 13 -5`: without ignore_unknown_options click reads "-5" as an option.
@app.command("priority", context_settings={"ignore_unknown_options": True})
def priority(job_id: str = typer.Argument(..., help="Job id (an array's: all its tasks), "
                                          "or ID_INDEX.", callback=_refs,
                                          autocompletion=complete.job_ids),
             value: int = typer.Argument(..., help="New priority (higher runs first).")) -> None:
    """Change a waiting job's priority."""
    ref, index = _job_ref(job_id)
    r = client.ask(m.PriorityRequest(ref, value, index=index))
    print(f"job {r.id}: priority {r.priority}")

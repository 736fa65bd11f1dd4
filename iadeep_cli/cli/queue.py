"""`iadeep queue ...`: submit, list, inspect and control jobs (through the controller)."""
from __future__ import annotations

import dataclasses
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
    MAX_MEM_GIB,
    JobSpec,
    JobState,
    SubmitSpec,
    check_interpreter,
    label_origin,
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
    gpus_at,
    job_label,
    moment,
    newest_runs,
    shorten,
    when,
)
from . import complete, render, sbatch
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
# the dependencies, as `queue add` and `queue update` both take them
AFTER = typer.Option(None, "--after", metavar="ID[,ID...]",
                     help="Start only once these jobs succeeded (cancelled if one ends "
                          "otherwise); an array's id: all its tasks.")
AFTER_ANY = typer.Option(None, "--after-any", metavar="ID[,ID...]",
                         help="Start once these jobs ended, in any state.")
AFTER_FAIL = typer.Option(None, "--after-fail", metavar="ID[,ID...]",
                          help="Start only once these jobs ended other than succeeded "
                               "(cancelled if one succeeds).")


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
    gpus: int = typer.Option(1, "--gpus", "-g", "-G", help="GPUs the job needs (on one node)."),
    gpu_mem: float | None = typer.Option(None, "--gpu-mem", metavar="GIB",
                                         help="GPU memory per GPU, GiB (default: from the "
                                              "workload's profile)."),
    mem: str | None = typer.Option(None, "--mem", metavar="SIZE",
                                   help="Host RAM as in Slurm (16G, 8000M): a limit where the "
                                        "node enforces it, counted where the inventory gives "
                                        "host_mem. A bare number up to 4096 is still read as "
                                        "GPU GiB (--gpu-mem), with a warning, this release."),
    name: str = typer.Option("", "--name", "--job-name", "-J",
                             help="A name to recognise it by."),
    workload: str | None = typer.Option(None, "--workload",
                                        help="Profile label (see `iadeep profile list`): "
                                             "the same label, the same program. Default: "
                                             "its program's, SCRIPT@USER:DIGEST of its "
                                             "content.",
                                        autocompletion=complete.workloads),
    new_workload: bool = typer.Option(False, "--new-workload",
                                      help="--workload is a new label, though close to a "
                                           "known one (it is profiled on its first run)."),
    priority: int = typer.Option(0, "--priority", help="Higher runs first."),
    exclusive: bool = typer.Option(False, "--exclusive", help="Never share its GPUs."),
    workdir: str | None = typer.Option(None, "--chdir", "-D", "--workdir", metavar="DIR",
                                       help="Working directory on the node (relative: to "
                                            "here). Default: this directory where the node "
                                            "shares it (shared_paths), else the job's own."),
    env: list[str] | None = typer.Option(None, "--env", help="NAME=VALUE, repeatable."),
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
    error: str | None = typer.Option(None, "--error", "-e", metavar="FILE",
                                     help="Its stderr into FILE (as --output); "
                                          "`iadeep logs ID --stderr` reads it."),
    constraint: str | None = typer.Option(None, "--constraint", "-C", metavar="LABEL[&LABEL]",
                                          help="Only on nodes with all these labels (labels: "
                                               "in nodes.yaml)."),
    nodelist: str | None = typer.Option(None, "--nodelist", "-w", metavar="NODE[,NODE]",
                                        help="Only on one of these nodes."),
    exclude: str | None = typer.Option(None, "--exclude", "-x", metavar="NODE[,NODE]",
                                       help="Never on these nodes."),
    after: str | None = AFTER,
    after_any: str | None = AFTER_ANY,
    after_fail: str | None = AFTER_FAIL,
    array: str | None = typer.Option(None, "--array", "-a", metavar="INDICES[%N]",
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
             "is minutes), instead of the lab's idle_after (at most that for members; "
             "docs/administration.md)."),
    no_adapt: bool = typer.Option(False, "--no-adapt",
                                  help="Never suspend this job when its shared GPU runs worse "
                                       "than serial (docs/scheduling.md 'Adapting at run time')."),
    # sbatch's own spellings, with sbatch's meaning (docs/submitting.md "Coming from Slurm")
    requeue: bool | None = typer.Option(None, "--requeue/--no-requeue",
                                        help="It may be requeued: it checkpoints on its "
                                             "--checkpoint-signal (USR1 by default) and starts "
                                             "again (sbatch's --requeue)."),
    hold: bool = typer.Option(False, "--hold", "-H", help="Queue it held, until `iadeep queue "
                              "release ID`."),
    begin: str | None = typer.Option(None, "--begin", "-b", metavar="TIME",
                                     help="Not before TIME, as sbatch writes it: now+1hour, "
                                          "16:00, 2026-12-24T09:00, tomorrow."),
    dependency: str | None = typer.Option(None, "--dependency", "-d", metavar="TYPE:ID[,...]",
                                          help="sbatch's afterok/afterany/afternotok:ID[:ID] "
                                               "(--after, --after-any, --after-fail) and "
                                               "singleton."),
    gres: str | None = typer.Option(None, "--gres", metavar="gpu[:TYPE]:N",
                                    help="GPUs as sbatch asks for them (= --gpus N)."),
    gpus_per_node: str | None = typer.Option(None, "--gpus-per-node", metavar="[TYPE:]N",
                                             help="= --gpus N (one node)."),
    gpus_per_task: str | None = typer.Option(None, "--gpus-per-task", metavar="[TYPE:]N",
                                             help="= --gpus N (one task)."),
    nodes: str | None = typer.Option(None, "--nodes", "-N", metavar="1",
                                     help="1: every job runs on one node; more is refused."),
    ntasks: str | None = typer.Option(None, "--ntasks", metavar="1",
                                      help="1: the script runs once; more is refused."),
    short_n: str | None = typer.Option(None, "-n", hidden=True),
    short_p: str | None = typer.Option(None, "-p", hidden=True),
    partition: str | None = typer.Option(None, "--partition", metavar="NAME",
                                         help="Accepted and noted (-p too): iadeep places on "
                                              "any node that fits."),
    account: str | None = typer.Option(None, "--account", "-A", help="Accepted and noted."),
    qos: str | None = typer.Option(None, "--qos", "-q", help="Accepted and noted."),
    cpus_per_task: str | None = typer.Option(None, "--cpus-per-task", "-c", metavar="N",
                                             help="CPUs: the job's SLURM_CPUS_PER_TASK, "
                                                  "counted where the inventory gives cpus."),
    mem_per_cpu: str | None = typer.Option(None, "--mem-per-cpu", metavar="SIZE",
                                           help="Host RAM per CPU (times --cpus-per-task)."),
    mail_type: str | None = typer.Option(None, "--mail-type", metavar="TYPE[,TYPE]",
                                         help="sbatch's BEGIN/END/FAIL/ALL/NONE, as --notify."),
    mail_user: str | None = typer.Option(None, "--mail-user", metavar="ADDRESS",
                                         help="Noted: messages go where the lab sends yours."),
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
    o, given = slurm_options(o, "the command line")
    if o["wrap"] is None:
        o = _with_directives(ctx, o, path, content, given)
    request = submission(o, content, path, "wrap" if o["wrap"] is not None else "")
    if o["test_only"]:
        print(trial_text(client.ask(m.TrialRequest(request))))
        return
    try:
        print(client.submit(request, content).id)
    except InputError as exc:
        # #SBATCH --mail-type where the lab has no channel to this user: a note, not a refusal
        # of a script that runs the same without its messages
        if not (exc.message.startswith("--notify") and o["notify"] is not None
                and ctx.get_parameter_source("notify") != ParameterSource.COMMANDLINE
                and "notify" not in given):
            raise
        _note(f"{path}: --mail-type left out: {exc.message}")
        request = submission({**o, "notify": None}, content, path,
                             "wrap" if o["wrap"] is not None else "")
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
    o, _ = slurm_options(o, "the command line")
    spec = JobSpec(script=path, args=tuple(o.get("args") or ()),
                   name=o["name"] or default_name, gpus=o["gpus"],
                   mem_gib=o["gpu_mem"], workload=o["workload"], priority=o["priority"],
                   exclusive=o["exclusive"], workdir=_chdir(o["workdir"]),
                   env=parse_env(o["env"] or ()), min_speed=o["min_speed"],
                   time_limit_s=None if o["time"] is None else parse_time_limit(o["time"]),
                   signal=o["signal"], submit_dir=_here(),
                   output=o["output"], error=o["error"],
                   constraint=() if o["constraint"] is None else
                   parse_names("--constraint", o["constraint"], "&"),
                   nodelist=() if o["nodelist"] is None else
                   parse_names("--nodelist", _hosts(o["nodelist"], "--nodelist")),
                   exclude=() if o["exclude"] is None else
                   parse_names("--exclude", _hosts(o["exclude"], "--exclude")),
                   exported=_exported(o["export"]),
                   after=_ids(o["after"], "--after"),
                   after_any=_ids(o["after_any"], "--after-any"),
                   after_fail=_ids(o["after_fail"], "--after-fail"), array=o["array"],
                   retry_on_fail=o["retry_on_fail"], no_adapt=o["no_adapt"],
                   checkpoint_signal=o["checkpoint_signal"], opportunistic=o["opportunistic"],
                   idle_after_s=None if o["idle_after"] is None else
                   parse_idle_after(o["idle_after"]),
                   requeue=bool(o["requeue"]), hold=bool(o["hold"]),
                   begin_at=None if o.get("begin") is None else float(o["begin"]),
                   cpus_per_task=o.get("cpus_per_task"),
                   host_mem_mib=o.get("host_mem_mib"))
    if o.get("singleton"):
        spec = _singleton(spec)
    # --retries and --notify not given: the controller applies the lab's defaults
    submitted = SubmitSpec.of(spec, retries=o["retries"], notify=o["notify"])
    validate_spec(submitted.spec)
    if o["workload"] and not o["new_workload"]:
        _check_workload(o["workload"])
    return submitted


def _hosts(text: str, option: str) -> str:
    """Slurm's host list (``gpu[1-3],cpu1``) as names, on the command line as in #SBATCH."""
    return ",".join(sbatch.expand_hostlist(text, option)) if "[" in text else text


def _singleton(spec: JobSpec) -> JobSpec:
    """sbatch's --dependency=singleton: after every unfinished job of this user with the same
    name (as --after-any; none: it may start at once)."""
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    jobs, _ = client.read(m.ListRequest(owner=me))
    same = tuple(j.id for j in jobs if j.name == spec.name and j.owner == me)
    return dataclasses.replace(spec, after_any=tuple(dict.fromkeys((*spec.after_any, *same))))


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


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def _deprecated(old: str, new: str, value: str) -> None:
    print(f"warning: {old} {value} is read as {new} {value} in this release only; {old} "
          f"takes sbatch's meaning next (write {new} {value})", file=sys.stderr)


# `queue add`'s parameters in sbatch's spelling only: turned into sbatch's words and read as
# #SBATCH lines are (``slurm_options``); parameter -> sbatch's long option.
SLURM_PARAMS = {"partition": "partition", "nodes": "nodes", "ntasks": "ntasks",
                "gres": "gres", "gpus_per_node": "gpus-per-node",
                "gpus_per_task": "gpus-per-task", "dependency": "dependency",
                "begin": "begin", "mail_type": "mail-type", "mail_user": "mail-user",
                "account": "account", "qos": "qos", "cpus_per_task": "cpus-per-task",
                "mem_per_cpu": "mem-per-cpu"}
_MEM = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]b?)?", re.IGNORECASE)
_ENV_ITEM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)


def slurm_options(o: dict, where: str) -> tuple[dict, set[str]]:
    """``o`` (`queue add`'s options by parameter) with its sbatch spellings read with sbatch's
    meaning (``sbatch.read_words``), the short options whose old meaning is deprecated
    (``-p N``, ``-n NAME``, ``-e NAME=VALUE``, ``--mem GIB``) read the old way with a
    warning, and the notes printed once. Returns it and the parameters those set (they count
    as given on the command line). All of the problems in one InputError naming ``where``."""
    if o.get("_slurm_read"):
        return o, set()
    out = dict(o)
    out["_slurm_read"] = True
    words: list[str] = []
    old: set[str] = set()   # set by a deprecated short option's old meaning
    short_p, short_n = out.pop("short_p", None), out.pop("short_n", None)
    if short_p is not None:
        if re.fullmatch(r"[-+]?\d+", short_p.strip()):
            _deprecated("-p", "--priority", short_p)
            out["priority"] = int(short_p)
            old.add("priority")
        else:
            words += ["--partition", short_p]
    if short_n is not None:
        if short_n.strip().isdigit():
            words += ["--ntasks", short_n]
        else:
            _deprecated("-n", "--name", short_n)
            out["name"] = out.get("name") or short_n
            old.add("name")
    for key, long in SLURM_PARAMS.items():
        if out.get(key) is not None:
            words += [f"--{long}", str(out.pop(key))]
        else:
            out.pop(key, None)
    reading = sbatch.Reading()
    sbatch.read_words(words, where, reading)
    sbatch.finish(reading)
    set_keys = set(reading.values) | old
    if reading.hold:
        out["hold"], set_keys = True, set_keys | {"hold"}
    if reading.singleton:
        out["singleton"], set_keys = True, set_keys | {"singleton"}
    mem = out.get("mem")
    if mem is not None:
        out["mem"] = None
        m = _MEM.fullmatch(str(mem).strip())
        if m is None:
            reading.problems.append(f"{where}: --mem {str(mem)[:40]!r} is not a size "
                                    "(e.g. 16G host RAM; GPU memory: --gpu-mem 12)")
        elif m[2] is None and float(m[1]) <= MAX_MEM_GIB:
            _deprecated("--mem", "--gpu-mem", str(mem))
            if out.get("gpu_mem") is None:
                out["gpu_mem"], set_keys = float(m[1]), set_keys | {"gpu_mem"}
        else:   # with a unit, or more MiB than any GPU has GiB: host RAM, as Slurm's
            try:
                out["host_mem_mib"] = sbatch.mem_mib(str(mem), "--mem")
                set_keys |= {"host_mem_mib"}
            except InputError as exc:
                reading.problems.append(f"{where}: {exc.message}")
    env = list(out.get("env") or [])
    sbatch_env = reading.values.pop("env", None)
    if isinstance(sbatch_env, list):
        env = [*sbatch_env, *env]
    if env:
        out["env"] = env
    for key in ("after", "after_any", "after_fail"):
        if key in reading.values:
            out[key] = ",".join(str(x) for x in (out.get(key), reading.values.pop(key)) if x)
    error = out.get("error")
    if isinstance(error, str) and _ENV_ITEM.fullmatch(error) and "/" not in error \
            and "%" not in error:   # the old -e NAME=VALUE
        _deprecated("-e", "--env", error)
        out["error"], env = None, [*env, error]
        out["env"] = env
    out.update(reading.values)
    if reading.problems:
        raise InputError("; ".join(reading.problems),
                         hint="docs/submitting.md 'Coming from Slurm' says what iadeep takes")
    if reading.notes:
        _note(f"on one node, from {where}: " + "; ".join(
            f"{k} ({v})" if v else k for k, v in reading.notes.items()))
    return out, set_keys


def _with_directives(ctx: typer.Context, given: dict, path: str, content: bytes,
                     from_command_line: set[str] = frozenset()) -> dict:  # type: ignore[assignment]
    """``given`` (this command's options) with the script's directives filled in where the
    command line does not set an option, as sbatch does: ``#SBATCH`` lines with sbatch's
    meaning (``cli/sbatch.py``; a lab setting IADEEP_SBATCH=warn leaves them unread, with a
    warning), then ``#IADEEP`` lines (`queue add`'s own options, winning over #SBATCH); --env
    adds to them. Every problem of the script is reported at once, each with its file:line."""
    text = content[:MAX_DIRECTIVE_SCAN].decode("utf-8", "replace")
    problems: list[str] = []
    hint = ("fix each line named; docs/submitting.md 'Coming from Slurm' says what iadeep "
            "takes from #SBATCH")
    try:
        lines = directives(text)
    except InputError as exc:   # names the line: add the file
        problems.append(f"{path}: {exc.message}")
        hint = exc.hint or hint
        lines = []
    from_iadeep = _iadeep_lines(ctx, path, lines, problems)
    from_sbatch: dict = {}
    if os.environ.get(sbatch.SETTING, "honour").strip().lower() == "warn":
        if not lines:
            _sbatch_note(path, text)
    else:
        reading = sbatch.read_script(path, text)
        problems += reading.problems
        from_sbatch = dict(reading.values)
        if reading.hold:
            from_sbatch["hold"] = True
        if reading.singleton:
            from_sbatch["singleton"] = True
        if reading.notes and not problems:
            _note(f"{path}: #SBATCH options that do nothing on one node: " + "; ".join(
                f"{k} ({v})" if v else k for k, v in reading.notes.items()))
    if len(problems) == 1:
        raise InputError(problems[0], hint=hint)
    if problems:
        raise InputError(f"{len(problems)} problems in {path}'s directives: "
                         + "; ".join(problems), hint=hint)
    out = dict(given)
    cli_env = list(given.get("env") or ())

    def on_command_line(key: str) -> bool:
        return key in from_command_line or (
            key in ctx.params and ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE)
    env: list[str] = []
    for values in (from_sbatch, from_iadeep):
        for key, value in values.items():
            if key == "env":
                env += list(value)
            elif not on_command_line(key):
                out[key] = value
    if env:
        out["env"] = [*env, *cli_env]   # the command line's come last, and win on the node
    return out


def _iadeep_lines(ctx: typer.Context, path: str, lines: list[tuple[int, list[str]]],
                  problems: list[str]) -> dict:
    """The #IADEEP lines' options (by parameter), each line parsed as this command's options
    and its sbatch spellings read as sbatch's (``slurm_options``); a line it does not take is
    a problem naming the script's line."""
    command = ctx.command
    from_lines: dict = {}
    for number, words in lines:
        where = f"{path}:{number}"
        try:
            with command.make_context(ctx.info_name, ["-", *words],
                                      parent=ctx.parent) as sub:
                pass
        except UsageError as exc:
            problems.append(f"{where}: #IADEEP {shlex.join(words)}: {exc.format_message()}")
            continue
        if sub.params.get("script") != "-" or sub.params.get("args"):
            problems.append(f"{where}: only options go on #IADEEP lines (arguments for the "
                            "script go on the command line)")
            continue
        line = {key: value for key, value in sub.params.items()
                if key not in ("script", "args", "wrap")
                and sub.get_parameter_source(key) == ParameterSource.COMMANDLINE}
        try:
            line, set_keys = slurm_options(line, where)
        except InputError as exc:
            problems.append(exc.message)
            continue
        line.pop("_slurm_read", None)
        for key, value in line.items():
            if value is None and key not in set_keys:
                continue
            if key == "env":
                from_lines[key] = [*from_lines.get(key, []), *value]
            else:
                from_lines[key] = value
    return from_lines


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
    render.stale_note(stale)   # on stderr: --json's stdout stays JSON
    if json_:
        render.as_json(m.encode(jobs))
        return
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
    """This attempt's run time so far (or in all, once ended) over its limit: ``12m/2h00m``
    (both as `duration` writes them: the column stays narrow enough for one line a job)."""
    began = job.started_at
    used = "-" if began is None else duration((job.ended_at or now) - began)
    return used if job.time_limit_s is None else f"{used}/{duration(job.time_limit_s)}"


def _fit(headers: list[str], rows: list[list[str]], columns: int) -> list[list[str]]:
    """One job a line on a terminal ``columns`` wide: NAME and REASON as wide as they are where
    the terminal has room, else NAME cut to 28 characters first, then REASON to the rest of the
    line (at least 20), then NAME further, then both to their last floors (a narrow terminal,
    long user names), each marked "..." (``text.column_widths``, as the monitor does). A pipe
    gets them whole, so grep finds them."""
    last = len(headers) - 1
    widths = column_widths(headers, rows, columns,
                           [(1, 28), (last, 20), (1, 12), (last, 8), (1, 6)])
    return [[r[0], shorten(r[1], widths[1]), *r[2:-1], shorten(r[-1], widths[-1])] for r in rows]


def _where(job: m.JobView) -> str:
    if not job.node:
        return "-"
    return gpus_at(job.node, job.gpu_indices)


SHOW_FIELDS = ("id", "name", "owner", "state", "reason", "script", "args", "workdir", "env",
               "gpus", "mem_gib", "workload", "priority", "exclusive", "retries", "time_limit_s",
               "signal", "notify", "attempts", "node", "gpu_indices", "remote_pid", "exit_code",
               "predicted_speed", "observed_speed",
               # submitting like sbatch (--chdir's default, --export, --output/--error, nodes)
               "submit_dir", "exported", "output", "error", "constraint", "nodelist", "exclude")
# Shown only on the jobs that have them (dependencies, arrays, reruns).
SHOW_IF_SET = ("after", "after_any", "after_fail", "array", "array_id", "array_index",
               "retry_on_fail", "rerun_of", "no_adapt", "suspended_s", "checkpoint_signal",
               "checkpoints", "opportunistic", "requeue", "requeueing", "preempted",
               "begin_at", "cpus_per_task", "host_mem_mib")


_field = field_text   # the monitor's details pane shows fields the same way


@app.command("show")
def show(job_id: str = typer.Argument(..., help="Job id (or ID_INDEX).", callback=_refs,
                                      autocompletion=complete.job_ids),
         json_: bool = JSON) -> None:
    """Show a job's fields and its event history."""
    detail, stale = client.read(m.ShowRequest(_job_id(job_id)))
    render.stale_note(stale)   # on stderr: --json's stdout stays JSON
    if json_:
        render.as_json(m.encode(detail))
        return
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
    print(f"job {_named(job_id, job)} is {job.state}: {reason}")
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
    print(f"label {job.workload or '-'}: {label_origin(job.workload, job.script, job.owner)}")


def _named(typed: str, job: m.JobView) -> str:
    """The job as the user named it, with what else it is called: ``6_5 (id 11)`` for an
    array's task named so, ``11 (task 6_5)`` for one named by its own id."""
    if job.array_id is None or job.array_index is None:
        return str(job.id)
    task = f"{job.array_id}_{job.array_index}"
    return f"{task} (id {job.id})" if "_" in typed else f"{job.id} (task {task})"


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


# `queue update 13 --priority -5`: without ignore_unknown_options click reads "-5" as an option.
@app.command("update", context_settings={"ignore_unknown_options": True})
def update(job_id: str = typer.Argument(..., help="Job id (or ID_INDEX).", callback=_refs,
                                        autocompletion=complete.job_ids),
           name: str | None = typer.Option(None, "--name", "--job-name", "-J",
                                           help="A new name."),
           time_limit: str | None = typer.Option(None, "--time", "-t", metavar="LIMIT",
                                                 help="A new time limit, as sbatch writes it "
                                                      "(a running job: its owner may lower it, "
                                                      "an admin also raise it)."),
           priority_: int | None = typer.Option(None, "--priority", help="A new priority "
                                                "(members: up to lab.max_priority)."),
           after: str | None = AFTER,
           after_any: str | None = AFTER_ANY,
           after_fail: str | None = AFTER_FAIL,
           ) -> None:
    """Change a job after submitting it (as `scontrol update`): its name, time limit, priority
    or dependencies (a new --after list replaces the old one, and names only older jobs); a
    running job only its time limit. Same checks and caps as `queue add`."""
    r = client.ask(m.UpdateRequest(
        _job_id(job_id), name=name,
        time_limit_s=None if time_limit is None else parse_time_limit(time_limit),
        priority=priority_,
        after=None if after is None else _ids(after, "--after"),
        after_any=None if after_any is None else _ids(after_any, "--after-any"),
        after_fail=None if after_fail is None else _ids(after_fail, "--after-fail")))
    print(f"job {r.id}: " + ("; ".join(r.changes) or "nothing changed (already so)"))

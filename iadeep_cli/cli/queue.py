"""`iadeep queue ...`: submit, list, inspect and control jobs (through the controller)."""
from __future__ import annotations

import difflib
import os
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path

import typer

from .. import messages as m
from ..controller import client
from ..errors import InputError
from ..jobs import (
    JobSpec,
    JobState,
    check_interpreter,
    parse_env,
    parse_job_ids,
    parse_time_limit,
    spec_to_dict,
    validate_spec,
)
from ..paths import file_problem
from ..text import clock, duration, hms, when
from . import render
from .errors import report

app = typer.Typer(help="Submit, list and control jobs.", no_args_is_help=True)

IDS = typer.Argument(..., help="One or more job ids; an array's id means all its tasks, "
                     "ID_INDEX (12_3) one task.")
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
    script: str = typer.Argument(..., help="Job script to run (copied to the node)."),
    args: list[str] | None = typer.Argument(None, help="Arguments for the script; put "
                                            "options meant for the script after `--`."),
    gpus: int = typer.Option(1, "--gpus", "-g", help="GPUs the job needs (on one node)."),
    mem: float | None = typer.Option(None, "--mem", help="GPU memory per GPU, GiB."),
    name: str = typer.Option("", "--name", "-n", help="A name to recognise it by."),
    workload: str | None = typer.Option(None, "--workload", "-w",
                                        help="Profile label (see `iadeep profile list`)."),
    new_workload: bool = typer.Option(False, "--new-workload",
                                      help="--workload is a new label, though close to a "
                                           "known one (it is profiled on its first run)."),
    priority: int = typer.Option(0, "--priority", "-p", help="Higher runs first."),
    exclusive: bool = typer.Option(False, "--exclusive", help="Never share its GPUs."),
    workdir: str | None = typer.Option(None, "--workdir", help="Working directory on the node."),
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
) -> None:
    """Queue SCRIPT to run on GPUs; prints the new job's id."""
    spec = JobSpec(script=_script_path(script), args=tuple(args or ()), name=name, gpus=gpus,
                   mem_gib=mem, workload=workload, priority=priority, exclusive=exclusive,
                   workdir=workdir, env=parse_env(env or ()), retries=retries or 0,
                   min_speed=min_speed,
                   time_limit_s=None if time is None else parse_time_limit(time),
                   signal=signal, notify=notify or "none",
                   after=_ids(after, "--after"), after_any=_ids(after_any, "--after-any"),
                   after_fail=_ids(after_fail, "--after-fail"), array=array,
                   retry_on_fail=retry_on_fail)
    validate_spec(spec)
    if workload and not new_workload:
        _check_workload(workload)
    request = spec_to_dict(spec)
    if retries is None:
        del request["retries"]   # the controller applies the lab's default
    if notify is None:
        del request["notify"]    # likewise
    print(client.submit(request, Path(spec.script).read_bytes()).id)


def _ids(text: str | None, option: str) -> tuple[int, ...]:
    return () if text is None else parse_job_ids(text, option)


@app.command("rerun")
def rerun(job_id: str = typer.Argument(..., help="A finished job's id (or ID_INDEX).")) -> None:
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
    json_: bool = JSON,
) -> None:
    """List unfinished jobs (all with --all)."""
    jobs, stale = client.read(m.ListRequest(all_states=all_, owner=owner))
    if json_:
        render.as_json(m.encode(jobs))
        return
    render.stale_note(stale)
    now = time.time()
    folded = _fold(jobs)
    rows = [[label, j.name, j.owner, j.state.value, str(j.gpus), _where(j),
             duration(now - j.submitted_at), j.reason] for label, j in folded]
    jobs = [j for _, j in folded]
    headers = LIST_HEADERS
    if any(j.time_limit_s is not None for j in jobs):   # only where some job has a limit
        headers = [*headers[:-1], "TIME", headers[-1]]
        rows = [[*r[:-1], _time_used(j, now), r[-1]] for r, j in zip(rows, jobs)]
    if sys.stdout.isatty() and not wide:
        rows = _fit(headers, rows, shutil.get_terminal_size().columns)
    render.table(headers, rows)


def _fold(jobs: list[m.JobView]) -> list[tuple[str, m.JobView]]:
    """(ID as shown, job) per line: an array's task reads ARRAY_INDEX (12_3), as in Slurm, and
    its queued tasks fold into one line where the first of them was (12_[3-5,9]), so a
    thousand-task array takes one line while it waits."""
    queued: dict[int, list[m.JobView]] = {}
    for j in jobs:
        if j.array_id is not None and j.state == JobState.QUEUED:
            queued.setdefault(j.array_id, []).append(j)
    out: list[tuple[str, m.JobView]] = []
    for j in jobs:
        if j.array_id is None:
            out.append((str(j.id), j))
        elif j.state != JobState.QUEUED or len(queued[j.array_id]) == 1:
            out.append((f"{j.array_id}_{j.array_index}", j))
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
    jobs, _ = client.read(m.ListRequest(all_states=True))
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
    """One job a line on a terminal: NAME cut to 28 characters and REASON to the rest of the
    line (at least 20), each marked "...". A pipe gets them whole, so grep finds them."""
    rows = [[r[0], _shorten(r[1], 28), *r[2:]] for r in rows]
    used = sum(max([len(h)] + [len(r[i]) for r in rows]) + 2 for i, h in enumerate(headers[:-1]))
    room = max(20, columns - used)
    return [[*r[:-1], _shorten(r[-1], room)] for r in rows]


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _where(job: m.JobView) -> str:
    if not job.node:
        return "-"
    return f"{job.node}:{','.join(str(i) for i in job.gpu_indices)}"


SHOW_FIELDS = ("id", "name", "owner", "state", "reason", "script", "args", "workdir", "env",
               "gpus", "mem_gib", "workload", "priority", "exclusive", "retries", "time_limit_s",
               "signal", "notify", "attempts", "node", "gpu_indices", "remote_pid", "exit_code",
               "predicted_speed", "observed_speed")
# Shown only on the jobs that have them (dependencies, arrays, reruns).
SHOW_IF_SET = ("after", "after_any", "after_fail", "array", "array_id", "array_index",
               "retry_on_fail", "rerun_of")


def _field(name: str, value) -> str:
    """A job field as a person reads it: '-' for nothing, yes/no, speeds to 2 decimals, the
    arguments and environment as they would be typed in a shell."""
    if value is None or (isinstance(value, (str, tuple, dict)) and not value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name == "time_limit_s":
        return hms(value)
    if isinstance(value, float):
        return f"{value:.2f}"
    if name == "args":
        return shlex.join(value)
    if name == "env":
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in value.items())
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


@app.command("show")
def show(job_id: str = typer.Argument(..., help="Job id (or ID_INDEX)."),
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
        print(f"{m.JobView.key(name):>16}: {_field(name, getattr(job, name))}")
        if name == "attempts" and job.attempts:   # which try this is, of how many allowed
            print(f"{'':>16}  (attempt {job.attempts} of {job.retries + 1})")
    for name in SHOW_IF_SET:
        if getattr(job, name) is not None:
            print(f"{name:>16}: {_field(name, getattr(job, name))}")
    for name in ("submitted_at", "started_at", "ended_at"):
        print(f"{name:>16}: {when(getattr(job, name))}")
    print("events:")
    render.table(["TIME", "FROM", "TO", "BY", "REASON"],
                 ([clock(e.at), e.old_state,
                   e.new_state, e.actor, e.reason] for e in detail.events))


@app.command("why")
def why(job_id: str = typer.Argument(..., help="Job id (or ID_INDEX).")) -> None:
    """Say why a job waits (or what it is doing)."""
    detail, stale = client.read(m.ShowRequest(_job_id(job_id)))
    render.stale_note(stale)
    job = render.clean(detail.job)
    reason = job.reason or "no reason recorded yet (the scheduler has not looked at it)"
    print(f"job {job.id} is {job.state}: {reason}")


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
                                          "or ID_INDEX."),
             value: int = typer.Argument(..., help="New priority (higher runs first).")) -> None:
    """Change a waiting job's priority."""
    ref, index = _job_ref(job_id)
    r = client.ask(m.PriorityRequest(ref, value, index=index))
    print(f"job {r.id}: priority {r.priority}")

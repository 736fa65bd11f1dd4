"""`iadeep queue ...`: submit, list, inspect and control jobs (through the controller)."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List, Optional

import typer

from ..controller import client
from ..errors import InputError, error_from_dict
from ..jobs import JobSpec, check_interpreter, parse_env, spec_to_dict, validate_spec
from . import render
from .errors import report

app = typer.Typer(help="Submit, list and control jobs.", no_args_is_help=True)

IDS = typer.Argument(..., help="One or more job ids.")
JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _script_path(script: str) -> str:
    path = Path(script).expanduser()
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise InputError(f"script {script!r} {what}",
                         hint="give the path of an executable job script, e.g. jobs/hello.sh")
    if not os.access(path, os.R_OK):
        raise InputError(f"script {script!r} is not readable", hint=f"chmod a+r {script}")
    check_interpreter(path)
    return str(path.resolve())


@app.command("add")
def add(
    script: str = typer.Argument(..., help="Job script to run (copied to the node)."),
    args: Optional[List[str]] = typer.Argument(None, help="Arguments for the script; put "
                                               "options meant for the script after `--`."),
    gpus: int = typer.Option(1, "--gpus", "-g", help="GPUs the job needs (on one node)."),
    mem: Optional[float] = typer.Option(None, "--mem", help="GPU memory per GPU, GiB."),
    name: str = typer.Option("", "--name", "-n", help="A name to recognise it by."),
    workload: Optional[str] = typer.Option(None, "--workload", "-w",
                                           help="Profile label (see `iadeep profile list`)."),
    priority: int = typer.Option(0, "--priority", "-p", help="Higher runs first."),
    exclusive: bool = typer.Option(False, "--exclusive", help="Never share its GPUs."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Working directory on the node."),
    env: Optional[List[str]] = typer.Option(None, "--env", "-e", help="NAME=VALUE, repeatable."),
    retries: Optional[int] = typer.Option(None, "--retries",
                                          help="Requeue this often if its node is lost "
                                               "(default: the lab's default_retries)."),
    min_speed: Optional[float] = typer.Option(None, "--min-speed",
                                              help="Lowest predicted speed accepted when "
                                                   "sharing (0-1]; default from the lab."),
) -> None:
    """Queue SCRIPT to run on GPUs; prints the new job's id."""
    spec = JobSpec(script=_script_path(script), args=tuple(args or ()), name=name, gpus=gpus,
                   mem_gib=mem, workload=workload, priority=priority, exclusive=exclusive,
                   workdir=workdir, env=parse_env(env or ()), retries=retries or 0,
                   min_speed=min_speed)
    validate_spec(spec)
    request = spec_to_dict(spec)
    if retries is None:
        del request["retries"]   # the controller applies the lab's default
    print(client.submit(request, Path(spec.script).read_bytes())["id"])


@app.command("list")
def list_(
    all_: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    user: Optional[str] = typer.Option(None, "--user", "-u", help="Only this user's jobs."),
    json_: bool = JSON,
) -> None:
    """List unfinished jobs (all with --all)."""
    jobs, stale = client.read("list", {"all_states": all_, "owner": user})
    if json_:
        render.as_json(jobs)
        return
    render.stale_note(stale)
    now = time.time()
    render.table(
        ["ID", "NAME", "USER", "STATE", "GPUS", "WHERE", "AGE", "REASON"],
        ([j["id"], j["name"][:28], j["user"], j["state"], j["gpus"], _where(j),
          render.duration(now - j["submitted_at"]), j["reason"][:60]] for j in jobs),
    )


def _where(job: dict) -> str:
    if not job["node"]:
        return "-"
    return f"{job['node']}:{','.join(str(i) for i in job['gpu_indices'])}"


@app.command("show")
def show(job_id: int = typer.Argument(..., help="Job id."), json_: bool = JSON) -> None:
    """Show a job's fields and its event history."""
    job, stale = client.read("show", {"id": job_id})
    if json_:
        render.as_json(job)
        return
    render.stale_note(stale)
    job = render.clean(job)
    for key in ("id", "name", "user", "state", "reason", "script", "args", "workdir", "env",
                "gpus", "mem_gib", "workload", "priority", "exclusive", "retries", "attempts",
                "node", "gpu_indices", "remote_pid", "exit_code", "predicted_speed",
                "observed_speed"):
        print(f"{key:>16}: {job[key]}")
    for key in ("submitted_at", "started_at", "ended_at"):
        print(f"{key:>16}: {render.when(job[key])}")
    print("events:")
    render.table(["TIME", "FROM", "TO", "BY", "REASON"],
                 ([time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"])), e["old_state"],
                   e["new_state"], e["actor"], e["reason"]] for e in job["events"]))


@app.command("why")
def why(job_id: int = typer.Argument(..., help="Job id.")) -> None:
    """Say why a job waits (or what it is doing)."""
    job, stale = client.read("show", {"id": job_id})
    render.stale_note(stale)
    job = render.clean(job)
    reason = job["reason"] or "no reason recorded yet (the scheduler has not looked at it)"
    print(f"job {job['id']} is {job['state']}: {reason}")


def _act(op: str, ids: list[int]) -> None:
    results = client.call(op, {"ids": ids})
    failed = 0
    for r in results:
        if "error" in r:
            failed += 1
            report(error_from_dict(r["error"]))
        else:
            print(f"job {r['id']}: {r['state']}")
    if failed:
        raise typer.Exit(1)


@app.command("cancel")
def cancel(ids: List[int] = IDS) -> None:
    """Cancel jobs (queued ones at once; running ones are stopped on their node)."""
    _act("cancel", ids)


@app.command("hold")
def hold(ids: List[int] = IDS) -> None:
    """Keep queued jobs from starting until released."""
    _act("hold", ids)


@app.command("release")
def release(ids: List[int] = IDS) -> None:
    """Let held jobs be scheduled again."""
    _act("release", ids)


@app.command("priority")
def priority(job_id: int = typer.Argument(..., help="Job id."),
             value: int = typer.Argument(..., help="New priority (higher runs first).")) -> None:
    """Change a waiting job's priority."""
    r = client.call("priority", {"id": job_id, "priority": value})
    print(f"job {r['id']}: priority {r['priority']}")

"""`iadeep queue update ID ...` answered: a job's name, time limit, priority or dependencies
changed after submission (``scontrol update``'s everyday uses), with the checks and caps of
submission and its owner's (or an admin's) permission.

A waiting job (queued or held) takes any change. A running job only a new time limit: its owner
may lower it (give back what it will not use), and an admin may also raise it (Slurm lets only
an operator extend a running job). A new dependency must name an older job, as at submission
(a job depends only on older ones, so no cycle can form).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ... import messages as m
from ...errors import InputError, InvalidTransition, PermissionDenied
from ...jobs import PENDING, Job, JobSpec, JobState, validate_spec
from ...store import jobrows
from ...text import hms
from . import admission

FIELDS = ("name", "time_limit_s", "priority", "after", "after_any", "after_fail")


def op_update(service: Any, user: str, req: m.UpdateRequest) -> m.UpdateResult:
    asked = {f: getattr(req, f) for f in FIELDS if getattr(req, f) is not None}
    if not asked:
        raise InputError("nothing to change", hint="give --name, --time, --priority, --after, "
                                                   "--after-any or --after-fail")
    with service.store.tx() as conn:
        job = service._owned(conn, user, req.id)
        _check_state(service, user, job, asked)
        spec = dataclasses.replace(job.spec, **asked)
        validate_spec(spec)
        if "priority" in asked:
            admission.check_priority(service.inventory, user, spec.priority)
        if "time_limit_s" in asked:
            spec = service._with_time_limit(spec)
        if {"after", "after_any", "after_fail"} & asked.keys():
            spec = service._checked_dependencies(conn, spec)
            _check_older(job, spec)
        changes = _changes(job.spec, spec)
        if changes:
            jobrows.replace_spec(conn, job.id, spec)
            jobrows.add_event(conn, job.id, service.clock(), job.state, job.state,
                              f"updated by {user}: " + "; ".join(changes), user)
    service.wake()
    return m.UpdateResult(job.id, tuple(changes))


def _check_state(service: Any, user: str, job: Job, asked: dict[str, Any]) -> None:
    if job.state in PENDING:
        return
    if job.state not in (JobState.STARTING, JobState.RUNNING, JobState.SUSPENDED):
        raise InvalidTransition(f"job {job.id} is {job.state}; only a waiting or running job "
                                "can be changed", hint="`iadeep queue rerun` runs it again "
                                                       "with changes")
    if set(asked) != {"time_limit_s"}:
        raise InvalidTransition(f"job {job.id} is {job.state}: only its time limit can change "
                                "now", hint="give --time alone")
    old, new = job.spec.time_limit_s, asked["time_limit_s"]
    if (old is None or new > old) and not service.inventory.is_admin(user):
        raise PermissionDenied(f"job {job.id} is running: only a lab admin may raise its time "
                               f"limit ({'none' if old is None else hms(old)}); {user} may "
                               "lower it", hint="ask a lab admin (lab.admins in nodes.yaml)")


def _check_older(job: Job, spec: JobSpec) -> None:
    for option, ids in (("--after", spec.after), ("--after-any", spec.after_any),
                        ("--after-fail", spec.after_fail)):
        newer = [i for i in ids if i >= job.id]
        if newer:
            raise InputError(f"{option} {newer[0]}: job {job.id} may depend only on jobs "
                             "submitted before it", hint="make the newer job wait for this "
                                                         "one instead")


def _changes(old: JobSpec, new: JobSpec) -> list[str]:
    def shown(name: str, value: Any) -> str:
        if name == "time_limit_s":
            return "none" if value is None else hms(value)
        if isinstance(value, tuple):
            return ",".join(map(str, value)) or "none"
        return str(value)
    label = {"time_limit_s": "time", "after_any": "after-any", "after_fail": "after-fail"}
    return [f"{label.get(f, f)} {shown(f, getattr(old, f))} -> {shown(f, getattr(new, f))}"
            for f in FIELDS if getattr(old, f) != getattr(new, f)]

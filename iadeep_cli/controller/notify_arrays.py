"""One message per array, not per task (as Slurm mails an array once unless asked per task).

A 1,000-task array that fails would otherwise send its owner 1,000 mails and the lab's webhook
1,000 posts. An array's tasks queue nothing of their own: the first task that starts queues the
array's start (``--notify all``), and the task whose end leaves none of the array unfinished
queues the array's end, which counts its tasks by state and names the ones that did not succeed.
"""
from __future__ import annotations

from ..jobs import FINISHED, Job, JobState
from ..text import clock as when
from .notify import Notice, clean

FINISHED_VALUES = frozenset(s.value for s in FINISHED)
NAMED_TASKS = 20   # an end message names at most this many tasks that did not succeed


def ended(counts: dict[str, int]) -> bool:
    """Whether every task of an array (its state -> how many) is in a final state."""
    return bool(counts) and all(state in FINISHED_VALUES for state in counts)


def array_state(counts: dict[str, int]) -> str:
    """The array's one state: its tasks' when they all share one, else the worst of them
    (failed, then timeout, then cancelled): 'succeeded' only when every task succeeded."""
    if len(counts) == 1:
        return next(iter(counts))
    for state in (JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED):
        if counts.get(state.value):
            return state.value
    return JobState.FAILED.value


def build_array(tasks: list[Job], kind: str, state: str) -> Notice:
    """The message for an array (``tasks``: all of them, its first task first)."""
    first = tasks[0]
    name = clean(first.name)[:100]
    array_id = first.array_id if first.array_id is not None else first.id
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task.state.value] = counts.get(task.state.value, 0) + 1
    tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    unsuccessful = [t for t in tasks if t.state is not JobState.SUCCEEDED]
    if kind == "array_start":
        headline = (f"Array {array_id} ({name}) of {first.owner} started: {len(tasks)} tasks "
                    f"(its first on {first.node or '-'})")
        summary = ""
    else:
        headline = f"Array {array_id} ({name}) of {first.owner} {state}: {tally}"
        summary = f"{len(tasks)} tasks | {tally}"
    body = [headline, "", f"  {'submitted:':<11}{when(first.submitted_at)}",
            f"  {'tasks:':<11}{len(tasks)}"]
    if kind == "array_end":
        body.append(f"  {'states:':<11}{tally}")
        if unsuccessful:
            body += ["", "Tasks that did not succeed (iadeep logs ID reads one's log):"]
            body += [f"  {t.id} (index {t.array_index}): {t.state.value}: {clean(t.reason)}"
                     for t in unsuccessful[:NAMED_TASKS]]
            if len(unsuccessful) > NAMED_TASKS:
                body.append(f"  ... and {len(unsuccessful) - NAMED_TASKS} more "
                            f"(iadeep queue list --all)")
    fields = {
        "event": kind,
        "array": {"id": array_id, "name": first.name, "owner": first.owner, "state": state,
                  "tasks": len(tasks), "states": counts,
                  "unsuccessful": [{"id": t.id, "index": t.array_index, "state": t.state.value,
                                    "exit_code": t.exit_code}
                                   for t in unsuccessful[:NAMED_TASKS]]},
    }
    subject = (f"[iadeep] array {array_id} ({name}) "
               f"{'started' if kind == 'array_start' else state}")
    return Notice(subject=subject[:200], headline=headline, summary=summary,
                  text="\n".join(body) + "\n", fields=fields)

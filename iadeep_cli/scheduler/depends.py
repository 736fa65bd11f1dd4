"""Job dependencies (``--after``, ``--after-any``, ``--after-fail``): whether a queued job may
be placed yet, a pure function of the states of the jobs it names.

The loop asks this before ``plan()``, so a job whose dependencies are not met is never even
considered for a GPU (it reserves nothing and starts nothing), and whatever the loop decides
from it is in the database: a restarted controller decides the same.

What each option asks for, all of them together (like Slurm's ``,``):

- ``--after ID``: ID ended ``succeeded``. It ending any other way (failed, cancelled, timeout)
  can never be undone, so the job is cancelled with the reason ("dependency 12 failed").
- ``--after-fail ID``: ID ended other than ``succeeded`` (failed, cancelled or timeout: the
  clean-up job of a chain). ID succeeding cancels it ("dependency 12 succeeded").
- ``--after-any ID``: ID ended, in any state; never cancels.

A job that is ``lost`` has not ended (its node may answer again), so its dependents wait.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..jobs import FINISHED, JobSpec, JobState, dependencies

# How a dependency's end reads in a reason: "dependency 12 failed".
_ENDED = {JobState.SUCCEEDED: "succeeded", JobState.FAILED: "failed",
          JobState.CANCELLED: "was cancelled", JobState.TIMEOUT: "timed out"}
_LISTED = 3   # waits named in a reason; the rest are counted


def check(spec: JobSpec, states: Mapping[int, JobState]) -> tuple[str | None, str | None]:
    """(why the job still waits, why it never can start); both None once every dependency is
    met. ``states``: the state of each job it names (a missing one no longer exists)."""
    waiting: list[str] = []
    for option, dep in dependencies(spec):
        state = states.get(dep)
        if state is None:
            return None, f"dependency {dep} does not exist"
        if state not in FINISHED:
            waiting.append(f"{dep} ({state})")
        elif option == "--after" and state != JobState.SUCCEEDED:
            return None, f"dependency {dep} {_ENDED[state]}"
        elif option == "--after-fail" and state == JobState.SUCCEEDED:
            return None, f"dependency {dep} succeeded (it was --after-fail)"
    if not waiting:
        return None, None
    more = len(waiting) - _LISTED
    named = ", ".join(waiting[:_LISTED]) + (f" and {more} more" if more > 0 else "")
    return f"waiting for job{'s' if len(waiting) > 1 else ''} {named}", None

"""What the service needs of the controller around it: the service's one way out of its room.

The runtime (``controller/runtime.py``) builds the service with a ``ControllerPort``: itself.
The service imports nothing of the scheduling round (the layer test refuses it); a keystroke,
a log read or a fence goes through ``ControllerPort.nodes()``, the round's nodes of the moment
(None while the controller schedules no nodes); an interactive job's owner heard from goes
through ``ControllerPort.heard``; forecasts are read through ``ControllerPort.forecasts()``
(the round hands the shared keeper its inputs). Without a controller (a service in a test, or
reading offline) ``STANDALONE`` answers: nothing to wake, no nodes, never degraded.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ... import messages as m
from ...errors import IadeepError, InputError
from ...jobs import Job

if TYPE_CHECKING:   # the forecast keeper (a shared module) loads placement: only with the loop
    from ..foresight import Foresight


class NodeWork(Protocol):
    """The round's nodes, as requests reach them (through the node pool of the moment)."""

    def read_log(self, job: Job, offset: int, max_bytes: int, stream: str
                 ) -> tuple[str, int, int | None]:
        """(the log's text from ``offset``, the next offset, its size if known); ``stream``:
        "output" (--output, or the job's log) or "error" (--error)."""

    def write_input(self, job: Job, data: bytes) -> None:
        """Keystrokes into a running ``--pty`` job's terminal (``Backend.write_input``)."""

    def fence(self, node: str, by: str) -> list[int]:
        """Every attempt on ``node`` declared dead by admin ``by``; the jobs it freed."""


class ControllerPort(Protocol):
    """What the service asks of the controller that runs it."""

    def wake(self) -> None:
        """Start the next round now (a write changed what it would decide)."""

    def reload(self) -> m.ReloadResult:
        """Re-read the inventory file (between rounds)."""

    def degraded(self) -> IadeepError | None:
        """Why new jobs are refused now (the state directory is unhealthy); None: they are not."""

    def nodes(self) -> NodeWork | None:
        """The round's nodes; None while the controller schedules none."""

    def heard(self, job_id: int, now: float) -> None:
        """The owner of interactive job ``job_id`` was heard from (a log read, keystrokes):
        the round stops one not heard from for ``lab.interactive_grace``
        (``controller/presence.py``)."""

    def forecasts(self) -> Foresight | None:
        """The round's forecast keeper (``controller/foresight.py``): expected starts and ends,
        ``queue add --test-only``'s trial; None while the controller schedules no nodes."""


class Standalone:
    """A service with no controller around it: nothing to wake, no nodes, never degraded."""

    def wake(self) -> None:
        return None

    def reload(self) -> m.ReloadResult:
        raise InputError("no controller runs this service: nothing to reload",
                         hint="start one: iadeep controller run --inventory FILE")

    def degraded(self) -> IadeepError | None:
        return None

    def nodes(self) -> NodeWork | None:
        return None

    def heard(self, job_id: int, now: float) -> None:
        return None

    def forecasts(self) -> Foresight | None:
        return None


STANDALONE = Standalone()

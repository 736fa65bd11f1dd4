"""Nodes whose launches fail, skipped a while (``Backoff``): read by launch, schedule and the
end of an attempt that never started (``ends``)."""
from __future__ import annotations

import dataclasses

LAUNCH_BACKOFF_S = (30.0, 600.0)   # a node whose launches fail is skipped this long, doubling


@dataclasses.dataclass
class LaunchHealth:
    """A node whose launches fail: skipped until ``until``, the delay doubling with each
    failure in a row (LAUNCH_BACKOFF_S) so a broken node costs one attempt per delay, not one
    per round."""
    failures: int = 0
    until: float = 0.0
    reason: str = ""

    def failed(self, reason: str, now: float) -> float:
        """Count one more failure; the seconds the node is now skipped."""
        self.failures += 1
        self.reason = reason
        delay = float(min(LAUNCH_BACKOFF_S[1], LAUNCH_BACKOFF_S[0] * 2 ** (self.failures - 1)))
        self.until = now + delay
        return delay


# node -> its launch failures in a row; a node that launches again is removed
Backoff = dict[str, LaunchHealth]

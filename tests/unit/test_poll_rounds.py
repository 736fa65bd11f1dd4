"""``NodePool.poll_all`` round by round: a hung node is waited for once, never every round.

The node's poll itself is replaced (``_Gated.poll``): one node answers at once, the other only
when the test opens its gate, so which poll a round waits for is decided by the code alone.
"""
from __future__ import annotations

import threading
import time

from iadeep_cli.nodes.poller import NodePool
from iadeep_cli.settings import Inventory, Node
from iadeep_cli.snapshot import NodeSnapshot

SAFETY_S = 30.0   # a round that wrongly waited for the hung node ends here instead of hanging


class _Gated(NodePool):
    def __init__(self, inventory: Inventory, hung: str):
        super().__init__(inventory)
        self.hung, self.gate = hung, threading.Event()
        self.calls: dict[str, int] = {}

    def poll(self, node_name, expect=(), owners=None, progress=None):
        self.calls[node_name] = self.calls.get(node_name, 0) + 1
        if node_name == self.hung:
            self.gate.wait(SAFETY_S * 3)
        return NodeSnapshot(node_name, 0.0)


def _pool(tmp_path) -> _Gated:
    nodes = tuple(Node(n, host="localhost", local=True, workdir=str(tmp_path / n))
                  for n in ("fast", "hung"))
    return _Gated(Inventory(nodes=nodes), hung="hung")


def _errors(snapshot) -> dict[str, str | None]:
    return {n.name: n.error for n in snapshot.nodes}


def test_a_node_hung_since_an_earlier_round_does_not_hold_up_the_next(tmp_path):
    pool = _pool(tmp_path)
    opener = threading.Timer(SAFETY_S, pool.gate.set)   # only if a round waits for it
    opener.start()
    try:
        first = pool.poll_all(wait_s=0.2)     # its poll began this round: waited for, briefly
        assert "its poll is still running" in (_errors(first)["hung"] or "")
        second = pool.poll_all(wait_s=SAFETY_S * 2)
        # had the round waited for the hung poll, the gate would have opened and it answered
        assert not pool.gate.is_set()
        assert _errors(second)["fast"] is None
        assert "its poll is still running" in (_errors(second)["hung"] or "")
        assert pool.calls == {"fast": 2, "hung": 1}   # never polled twice while hung
        pool.gate.set()                       # it answers late: a later round uses it
        deadline = time.monotonic() + SAFETY_S
        third = pool.poll_all(wait_s=SAFETY_S)
        while _errors(third)["hung"] is not None and time.monotonic() < deadline:
            time.sleep(0.05)
            third = pool.poll_all(wait_s=SAFETY_S)
        assert _errors(third) == {"fast": None, "hung": None}
    finally:
        opener.cancel()
        pool.gate.set()
        pool.close()

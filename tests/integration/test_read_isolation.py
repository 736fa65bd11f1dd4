"""Reads never hold up the scheduling round: a request that reads (`queue list --all`,
`status`) reads a snapshot on a connection of its own, not through the writer's lock, and a
long history comes a page at a time. A real controller's socket and database, the real CLI."""
from __future__ import annotations

import threading

import pytest

from helpers.accounts import cli_here
from iadeep_cli.jobs import JobSpec, JobState
from iadeep_cli.store import jobrows


@pytest.fixture
def ctl(tmp_path):
    from iadeep_cli.controller.runtime import Controller
    from iadeep_cli.settings import Inventory

    ctl = Controller(Inventory(nodes=()), tmp_path / "state")
    ctl.heartbeat()
    ctl.socket.start()
    yield ctl
    ctl.socket.close()
    ctl.store.close()


def _ask(ctl, op: str, args: dict):
    from iadeep_cli.controller import client

    return client.call(op, args, socket_path=ctl.socket.path, timeout=30)


def test_reads_answer_while_the_round_holds_the_store(ctl):
    """While the loop holds the store (its lock, an open write transaction), `queue list
    --all`, `queue show` and `status` are answered, from what was committed before it."""
    with ctl.store.tx() as conn:
        first, _ = jobrows.insert(conn, "alice", JobSpec("/x.sh"), 1.0)
    answers: dict[str, object] = {}

    def read() -> None:
        try:
            answers["list"] = _ask(ctl, "list", {"all_states": True})
            answers["show"] = _ask(ctl, "show", {"id": first})
            answers["status"] = _ask(ctl, "status", {})
        except Exception as exc:   # the client's timeout: the read waited for the writer
            answers["failed"] = repr(exc)

    with ctl.store.tx() as conn:   # what a round holds while it writes
        jobrows.insert(conn, "alice", JobSpec("/y.sh"), 2.0)
        reader = threading.Thread(target=read)
        reader.start()
        reader.join(120)
        assert not reader.is_alive() and "failed" not in answers, \
            f"a read waited for the writer: {answers.get('failed')}"
    assert [j["id"] for j in answers["list"]] == [first]   # not the uncommitted one
    assert answers["status"]["queue"]["queued"] == 1


def test_all_jobs_come_a_bounded_page_at_a_time(ctl):
    from iadeep_cli import messages as m

    with ctl.store.tx() as conn:
        ids = [jobrows.insert(conn, "alice", JobSpec("/x.sh"), float(i))[0] for i in range(25)]
        for i in ids[:20]:   # finished: only --all shows them
            jobrows.transition(conn, i, JobState.CANCELLED, "test", "test", 30.0)
    assert len(_ask(ctl, "list", {})) == 5
    assert len(_ask(ctl, "list", {"all_states": True})) == 25 <= m.LIST_ALL_LIMIT
    page = _ask(ctl, "list", {"all_states": True, "limit": 10})
    assert [j["id"] for j in page] == ids[15:]   # the newest, oldest first
    page = _ask(ctl, "list", {"all_states": True, "limit": 10, "before": page[0]["id"]})
    assert [j["id"] for j in page] == ids[5:15]
    from iadeep_cli.errors import InputError
    with pytest.raises(InputError, match="list limit 0 is out of range"):
        _ask(ctl, "list", {"all_states": True, "limit": 0})

    shown = cli_here(ctl.state.root, "queue", "list", "--all", "--limit", "10")
    assert shown["rc"] == 0
    assert shown["err"] == f"note: showing the newest 10 jobs; older ones: --before {ids[15]}\n"
    assert len(shown["out"].splitlines()) == 11   # the header and ten jobs
    older = cli_here(ctl.state.root, "queue", "list", "--all", "--limit", "10", "--before",
                     str(ids[15]), "--json")
    assert older["rc"] == 0 and '"id": ' + str(ids[5]) in older["out"]
    bad = cli_here(ctl.state.root, "queue", "list", "--all", "--limit", "0")
    assert bad["rc"] == 1 and bad["err"].startswith("Error: list limit 0 is out of range")
    assert bad["err"].count("\n") <= 2

"""Co-location rows are one member's word until another member's jobs agree, or an admin adopts
them (``store/profiles.py``), over a real SQLite store: which rows agree, which stay held, and
that only the lab's rows reach a fit (``load_colocations``)."""
from __future__ import annotations

import pytest

from iadeep_cli.errors import NotFoundError
from iadeep_cli.profiles import CoLocation
from iadeep_cli.store import Store, profiles as profrows

H200 = "NVIDIA H200"


@pytest.fixture
def conn(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as c:
        yield c
    store.close()


def _add(conn, owners, jobs=("mlp", "lstm"), speeds=(0.6, 0.8), gpu=H200):
    return profrows.add_colocation(conn, CoLocation(gpu, jobs, speeds), 1.0, owners=owners)


def _kinds(conn) -> list[tuple[list[str], str]]:
    return [(r["owners"], r["kind"]) for r in profrows.colocation_rows(conn)]


def test_rows_of_users_in_common_never_agree_and_stay_held(conn):
    _add(conn, ["mallory"])
    _add(conn, ["mallory"], speeds=(0.61, 0.79))
    _add(conn, ["bob", "mallory"])     # mallory's job beside bob's: mallory's word too
    assert _kinds(conn) == [(["mallory"], "held"), (["mallory"], "held"),
                            (["bob", "mallory"], "held")]
    assert profrows.load_colocations(conn) == []


def test_another_members_agreeing_row_makes_both_the_labs(conn):
    _add(conn, ["alice"])
    _add(conn, ["bob"], jobs=("mlp", "lstm"), speeds=(0.9, 0.8))    # 50 % off: not agreeing
    _add(conn, ["bob"], jobs=("mlp", "lstm"), speeds=(0.6, 0.8), gpu="NVIDIA A100")   # other GPU
    row, kind = _add(conn, ["carol"], jobs=("lstm", "mlp"), speeds=(0.85, 0.55))   # either order
    assert kind == "lab" and _kinds(conn) == [(["alice"], "lab"), (["bob"], "held"),
                                              (["bob"], "held"), (["carol"], "lab")]
    rows = profrows.colocation_rows(conn)
    assert rows[0]["note"] == "agreed by jobs of carol"
    assert rows[3]["note"] == "agrees with row 1 (alice)" and rows[3]["id"] == row
    assert profrows.load_colocations(conn) == [CoLocation(H200, ("mlp", "lstm"), (0.6, 0.8)),
                                               CoLocation(H200, ("lstm", "mlp"), (0.85, 0.55))]


def test_an_admin_adopts_and_removes_rows(conn):
    held, _ = _add(conn, ["alice"])
    other, _ = _add(conn, ["alice"], jobs=("vgg16", "mlp"))
    lab, _ = profrows.add_colocation(conn, CoLocation(H200, ("a", "b"), (0.5, 0.5)), 1.0)
    profrows.adopt_colocations(conn, [held], "root")
    assert _kinds(conn) == [(["alice"], "lab"), (["alice"], "held"), ([], "lab")]
    assert profrows.colocation_rows(conn)[0]["note"] == "adopted by root"
    profrows.remove_colocations(conn, [held, lab])
    assert [r["id"] for r in profrows.colocation_rows(conn)] == [other]
    with pytest.raises(NotFoundError, match="no co-location row 99"):
        profrows.remove_colocations(conn, [other, 99])
    assert [r["id"] for r in profrows.colocation_rows(conn)] == [other]   # checked first

"""Jobs without --workload are labelled after their program (jobs.program_label): the script's
name, its owner and its content's digest. The real service and store (SQLite); the members are
the names the service is told (the socket's peer, in a real controller)."""
from __future__ import annotations

import hashlib

import pytest

from helpers.service_lab import service_lab, submit
from iadeep_cli import messages as m
from iadeep_cli.jobs import JobState, label_origin, program_label
from iadeep_cli.store import jobrows


@pytest.fixture
def lab(tmp_path):
    with service_lab(tmp_path) as (store, service):
        yield store, service, tmp_path


def _add(service, path, text: str, user: str, **spec) -> str | None:
    """Submit ``text`` as the script at ``path`` for ``user``; the job's label."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    job_id = submit(service, user, path, **spec)
    with service.store.tx() as c:
        return jobrows.get(c, job_id).spec.workload


RESNET = "import torch\nprint('resnet')\n"
BERT = "import torch\nprint('bert')\n"


def test_two_members_train_py_scripts_get_two_labels_and_one_script_twice_gets_one(lab):
    _, service, tmp = lab
    alice = _add(service, tmp / "alice" / "train.py", RESNET, "alice")
    bob = _add(service, tmp / "bob" / "train.py", BERT, "bob")
    again = _add(service, tmp / "alice" / "train.py", RESNET, "alice")
    elsewhere = _add(service, tmp / "alice" / "copy" / "train.py", RESNET, "alice")
    digest = hashlib.sha256(RESNET.encode()).hexdigest()[:6]
    assert alice == f"train.py@alice:{digest}" and bob.startswith("train.py@bob:")
    assert alice != bob and again == alice and elsewhere == alice


def test_one_members_two_different_scripts_of_one_name_get_two_labels(lab):
    _, service, tmp = lab
    first = _add(service, tmp / "a" / "train.py", RESNET, "alice")
    second = _add(service, tmp / "b" / "train.py", BERT, "alice")
    same_text_other_member = _add(service, tmp / "c" / "train.py", RESNET, "bob")
    assert len({first, second, same_text_other_member}) == 3


def test_workload_still_says_same_program_and_an_array_shares_its_label(lab):
    store, service, tmp = lab
    given = [_add(service, tmp / w / "train.py", text, who, workload="resnet50")
             for w, text, who in (("a", RESNET, "alice"), ("b", BERT, "bob"))]
    assert given == ["resnet50", "resnet50"]
    _add(service, tmp / "arr" / "train.py", BERT, "carol", array="0-2")
    with store.tx() as c:
        labels = {j.spec.workload for j in jobrows.select(c) if j.owner == "carol"}
    assert labels == {program_label("/x/train.py", BERT.encode(), "carol")}


def test_a_wrapped_command_is_labelled_by_the_command():
    one = program_label("/home/a/wrap.sh", b"#!/bin/sh\npython train.py --big\n", "alice")
    two = program_label("/home/a/wrap.sh", b"#!/bin/sh\npython eval.py\n", "alice")
    assert one != two and one.startswith("wrap.sh@alice:")


@pytest.mark.parametrize("workload, script, owner, says", [
    ("train.py@alice:3f9a1c", "/h/alice/train.py", "alice", "its program's: script train.py "
     "of alice, content sha256 3f9a1c..., given to a job submitted without --workload"),
    ("train.py@alice:3f9a1c", None, None, "its program's: script train.py of alice"),
    ("resnet50", "/h/alice/train.py", "alice", "given with --workload"),
    ("train", "/h/alice/train.py", "alice", "given with --workload, or its script's name "
     "(jobs queued before labels named programs)"),
    (None, "/h/alice/train.py", "alice", "none yet: queued before labels named programs"),
    ("train.py@bob:3f9a1c", "/h/alice/train.py", "alice", "given with --workload"),
    ("resnet50", None, None, "a --workload label, or a script's name (profiles from before"),
])
def test_why_a_job_has_its_label_is_said(workload, script, owner, says):
    assert label_origin(workload, script, owner).startswith(says)


def test_a_job_queued_before_labels_named_programs_keeps_none_and_its_rerun_gets_one(lab):
    """Compatibility: a job without a label in the database (queued before the upgrade) keeps
    it (the profiler names it after its script, as before); run again, it gets its program's."""
    store, service, tmp = lab
    job = _add(service, tmp / "old" / "train.py", RESNET, "alice")
    with store.tx() as c:
        [old] = [j.id for j in jobrows.select(c)]
        jobrows.update(c, old, workload=None)     # as a job queued before the upgrade is
        jobrows.transition(c, old, JobState.CANCELLED, "cancelled", "alice", 1000.0)
        assert jobrows.get(c, old).spec.workload is None
    again = service.op_rerun("alice", m.RerunRequest(old)).id
    with store.tx() as c:
        assert jobrows.get(c, again).spec.workload == job

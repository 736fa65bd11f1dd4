"""Telling programs apart end to end: a real sshd node, a real controller, the real CLI.

Two different scripts both called ``train.sh``, submitted without --workload, are profiled as
two programs (two labels, two profiles); the first one submitted again is known at once (its
label has a profile, so it is not profiled again). ``queue why`` and ``profile show`` say
which label a job was given and why. (Two members' scripts: tests/unit/test_program_labels.py,
with the real service; here every job is this account's.)
"""
from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest

from helpers.controllers import cli, fake_gpu_lab, queue_add, wait_jobs
from iadeep_cli.jobs import program_label

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, lab="node_grace: 30") as ctl:
        yield ctl


def _train_sh(folder: Path, which: str) -> Path:
    """A ``train.sh`` that runs the progress-reporting example job; ``which`` makes two
    different programs of one name."""
    folder.mkdir()
    script = folder / "train.sh"
    script.write_text(f"#!/bin/sh\n# {which}\nexec {ROOT / 'jobs/steps_progress.sh'} 6000 0.1\n")
    script.chmod(0o755)
    return script


def _profiled(home: Path, job: int, label: str) -> dict:
    """Run ``job`` until its label has a profile, then cancel it; the profile."""
    wait_jobs(home, lambda js: js[job]["state"] == "running")
    wait_jobs(home, lambda js: label in {p["workload"] for p in json.loads(
        cli(home, "profile", "list", "--json", check=True).stdout)}, timeout=180)
    cli(home, "queue", "cancel", str(job), check=True)
    wait_jobs(home, lambda js: js[job]["state"] == "cancelled", timeout=120)
    return json.loads(cli(home, "profile", "show", label, "--json", check=True).stdout)


def test_two_train_sh_get_two_profiles_and_the_same_one_again_shares_its_own(lab, tmp_path):
    home = lab.home
    me = pwd.getpwuid(os.getuid()).pw_name
    resnet, bert = _train_sh(tmp_path / "resnet", "resnet"), _train_sh(tmp_path / "bert", "bert")
    labels = [program_label(str(s), s.read_bytes(), me) for s in (resnet, bert)]
    assert labels[0] != labels[1] and all(x.startswith(f"train.sh@{me}:") for x in labels)

    first = queue_add(home, str(resnet))
    why = cli(home, "queue", "why", str(first), check=True).stdout
    assert f"label {labels[0]}: its program's: script train.sh of {me}, content sha256 " \
        f"{labels[0][-6:]}..., given to a job submitted without --workload" in why, why
    profiles = [_profiled(home, first, labels[0])]
    second = queue_add(home, str(bert))
    profiles.append(_profiled(home, second, labels[1]))
    assert [[s["job"] for s in p["samples"]] for p in profiles] == [[first], [second]]

    again = queue_add(home, str(resnet))   # the same program: its label is known already
    jobs = wait_jobs(home, lambda js: js[again]["state"] == "running")
    assert jobs[again]["workload"] == labels[0]
    listed = [p["workload"] for p in json.loads(cli(home, "profile", "list", "--json",
                                                    check=True).stdout)]
    assert sorted(x for x in listed if x.startswith("train.sh@")) == sorted(labels)
    shown = cli(home, "profile", "show", labels[0], check=True).stdout
    assert f"label: its program's: script train.sh of {me}" in shown, shown
    cli(home, "queue", "cancel", str(again), check=True)
    wait_jobs(home, lambda js: js[again]["state"] == "cancelled", timeout=120)
    assert [s["job"] for s in json.loads(cli(home, "profile", "show", labels[0], "--json",
                                              check=True).stdout)["samples"]] == [first]

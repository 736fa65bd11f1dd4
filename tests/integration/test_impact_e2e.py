"""The impact factor end to end: a real sshd node (one GPU, the stand-in nvidia-smi), a real
controller process, jobs that report progress, running alone and sharing the GPU. The figures
`iadeep report --json` and `iadeep status --json` give must match a hand computation from the
recorded events (`queue show --json`) and the speeds recorded on the jobs, within 1%.

The jobs write progress as iterations proportional to the time elapsed (1000 it/s whatever
happens), so the speed the controller measures is 1.00, alone and sharing: A's work is then its
running time (but for the poll round after B arrives, when A's rate is its prediction until the
next poll measures it: a second or two of twenty). B starts while A runs and so never ran alone
before sharing: its speed while sharing is not measured but predicted (the model's, recorded
on its row); once A has ended it runs alone, at 1.00 by definition.
"""
from __future__ import annotations

import itertools
import json
import sys
import time

import pytest

from helpers.controllers import cli, fake_gpu_lab, jobs_by_id, queue_add, wait_until

PROGRESS = f"""#!{sys.executable}
import os, sys, time
stop, start = sys.argv[1], time.time()
path = os.environ.get("IADEEP_PROGRESS_FILE")
while not os.path.exists(stop):
    time.sleep(0.05)
    now = time.time()
    if path:
        with open(path, "a") as f:
            f.write(f"{{now:.6f}} {{int((now - start) * 1000)}}\\n")
"""


def _running_intervals(home, job_id: int) -> list[tuple[float, float]]:
    events = json.loads(cli(home, "queue", "show", str(job_id), "--json", check=True).stdout
                        )["events"]
    return [(ev["at"], nxt["at"]) for ev, nxt in itertools.pairwise(events)
            if ev["new_state"] == "running"]


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a1, b1) - max(a0, b0)) for a0, a1 in a for b0, b1 in b)


def _length(xs: list[tuple[float, float]]) -> float:
    return sum(t1 - t0 for t0, t1 in xs)


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, lab="node_grace: 30") as ctl:
        # A node whose driver gives no per-process figures: a sharing job's speed is then its
        # prediction until progress measures it, which the by-hand sums below assume (with
        # pmon's figures the controller would judge B by the stand-in's made-up SM share).
        for node in ctl.cluster.nodes.values():
            (node.state / "nopmon").write_text("1\n")
        yield ctl


def test_impact_factor_matches_the_events_in_report_and_status(lab, tmp_path):
    home = lab.home
    script = tmp_path / "train.py"
    script.write_text(PROGRESS)
    script.chmod(0o755)

    def add(stop: str) -> int:   # runs until the file ``stop`` exists
        return queue_add(home, str(script), str(tmp_path / stop), "--workload", "mlp")

    def state(job_id: int) -> str:
        return jobs_by_id(home)[job_id]["state"]

    a = add("stop-a")
    # A alone until its solo rate is measured (its first observed speed, 1.00 alone): B must
    # not join before, or A's speed while sharing could not be measured but only predicted
    wait_until(lambda: jobs_by_id(home)[a]["observed_speed"] is not None, 120)
    b = add("stop-b")   # shares A's GPU (mlp with mlp: 0.90 each), then runs alone
    wait_until(lambda: state(b) == "running", 60)
    # Sharing for long enough that the one poll round after B starts, in which A runs at its
    # prediction (0.90) until the next poll measures it, stays well within the 1%.
    time.sleep(20)
    (tmp_path / "stop-a").touch()
    wait_until(lambda: state(a) == "succeeded", 60)
    time.sleep(2)
    (tmp_path / "stop-b").touch()
    wait_until(lambda: state(b) == "succeeded", 60)
    jobs = jobs_by_id(home)
    ra, rb = _running_intervals(home, a), _running_intervals(home, b)
    together = _overlap(ra, rb)
    assert together > 15.0, (ra, rb)            # they did share the GPU
    assert _length(rb) - together > 1.0         # and B ran alone after A ended
    assert jobs[a]["observed_speed"] == pytest.approx(1.0, abs=0.01)   # measured, alone too
    predicted_b = jobs[b]["predicted_speed"]
    assert predicted_b is not None and predicted_b < 0.99

    # By hand: A at 1.00 all along; B at its prediction while sharing, 1.00 alone after.
    work = _length(ra) + together * predicted_b + (_length(rb) - together)
    busy = _length(ra) + _length(rb) - together   # one GPU: busy while either runs
    factor = work / busy

    rep = json.loads(cli(home, "report", "--since", "1h", "--json", check=True).stdout)
    total = rep["total"]
    assert total["jobs"] == 2
    assert total["work_gpu_hours"] == pytest.approx(work / 3600, rel=0.01)
    assert total["busy_gpu_hours"] == pytest.approx(busy / 3600, rel=0.01)
    assert total["impact_factor"] == pytest.approx(factor, rel=0.01)
    assert total["saved_gpu_hours"] == pytest.approx((work - busy) / 3600, rel=0.05, abs=1e-5)
    assert total["sharing_gpu_hours"] == pytest.approx(2 * together / 3600, rel=0.02)
    # while sharing: A measured at 1.00, B predicted
    assert total["sharing_speed"] == pytest.approx((1.0 + predicted_b) / 2, rel=0.01)
    # A's work was measured (all but its first polls, before two progress lines existed)
    assert 0.5 * _length(ra) / work < total["measured_share"] <= (work - together *
                                                                 predicted_b) / work + 0.01
    # the stand-in GPU draws 121.99 W while busy, shared out among its jobs
    assert total["energy_kwh"] == pytest.approx(121.99 * busy / 3.6e6, rel=0.01)

    status = json.loads(cli(home, "status", "--json", check=True).stdout)
    assert status["live"] is True
    for key in ("impact_last_hour", "impact_since_start"):
        seen = status[key]
        assert seen["impact_factor"] == pytest.approx(factor, rel=0.01), key
        assert seen["work_gpu_hours"] == pytest.approx(work / 3600, rel=0.01), key
        assert seen["busy_gpu_hours"] == pytest.approx(busy / 3600, rel=0.01), key
    line = [x for x in cli(home, "status", check=True).stdout.splitlines()
            if x.startswith("impact factor: ")]
    assert len(line) == 1
    print(line[0])   # for docs/accounting.md (pytest -s)
    assert float(line[0].split()[2]) == pytest.approx(factor, abs=0.01 + 0.01 * factor)

"""`iadeep report`'s impact columns and `--plot`, as real processes over a real database.

The database is written with the store's own functions (jobs moved by ``transition``, polls
accounted by ``impact.tick``) for two days: on the first, two jobs share one GPU at predicted
speeds 0.8 and 0.7 for an hour; on the second, one job runs alone for an hour.
"""
from __future__ import annotations

import csv
import io
import json
import time

import pytest

from helpers.controllers import cli
from iadeep_cli.jobs import JobSpec, JobState
from iadeep_cli.store import Store, impact, jobrows as jobs

S = JobState
DAY = 86400.0


def _run(c, owner, start, end, predicted):
    job_id, _ = jobs.insert(c, owner, JobSpec(script="/j.sh"), start - 60)
    jobs.transition(c, job_id, S.STARTING, "placed", "ctl", start, node="n1", gpu_indices=(0,),
                    started_at=start, predicted_speed=predicted)
    jobs.transition(c, job_id, S.RUNNING, "running", "ctl", start)
    return job_id


@pytest.fixture
def lab(tmp_path):
    day1 = (time.time() // DAY - 3) * DAY + 12 * 3600   # noon UTC, three days ago
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as c:
        a = _run(c, "alice", day1, day1 + 3600, 0.8)
        b = _run(c, "bob", day1, day1 + 3600, 0.7)
        impact.tick(c, day1 + 1800, {}, {})
        for job_id in (a, b):
            jobs.transition(c, job_id, S.SUCCEEDED, "exited", "ctl", day1 + 3600,
                            ended_at=day1 + 3600, exit_code=0)
        solo = _run(c, "alice", day1 + DAY, day1 + DAY + 3600, None)
        jobs.transition(c, solo, S.SUCCEEDED, "exited", "ctl", day1 + DAY + 3600,
                        ended_at=day1 + DAY + 3600, exit_code=0)
    store.close()
    return tmp_path


def test_report_columns_by_hand(lab):
    out = json.loads(cli(lab, "report", "--since", "7d", "--by", "user", "--json",
                         check=True).stdout)
    users = {g["key"]: g for g in out["groups"]}
    # alice: 1 h at 0.8 sharing (0.5 busy GPU-h) + 1 h alone; bob: 1 h at 0.7 sharing
    assert users["alice"]["work_gpu_hours"] == pytest.approx(1.8)
    assert users["alice"]["busy_gpu_hours"] == pytest.approx(1.5)
    assert users["alice"]["sharing_speed"] == pytest.approx(0.8)
    assert users["bob"]["impact_factor"] == pytest.approx(1.4)
    assert users["bob"]["saved_gpu_hours"] == pytest.approx(0.2)
    assert out["total"]["impact_factor"] == pytest.approx(2.5 / 2.0)
    assert out["total"]["measured_share"] == 0.0 and out["total"]["energy_kwh"] is None
    table = cli(lab, "report", "--since", "7d", check=True).stdout
    header = next(line for line in table.splitlines() if "impact" in line)
    assert header.split()[-7:] == ["work", "busy", "saved", "impact", "measured", "sharing",
                                   "kWh"]
    total = next(line for line in table.splitlines() if line.startswith("total"))
    assert total.split()[-7:] == ["2.5", "2.0", "+0.5", "1.25", "0%", "0.75", "-"]
    rows = list(csv.DictReader(io.StringIO(cli(lab, "report", "--since", "7d", "--csv",
                                               check=True).stdout)))
    assert float(rows[-1]["impact_factor"]) == pytest.approx(1.25)


def test_plot_draws_a_png_and_only_then_loads_matplotlib(lab, tmp_path):
    target = tmp_path / "out" / "usage.png"
    target.parent.mkdir()
    proc = cli(lab, "report", "--since", "7d", "--plot", str(target))
    assert proc.returncode == 0, proc.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.stat().st_size > 5000
    assert "total" in proc.stdout                        # the table is printed as well
    imports = cli(lab, "report", "--since", "7d", PYTHONPROFILEIMPORTTIME="1")
    assert imports.returncode == 0 and "matplotlib" not in imports.stderr


def test_bad_plot_targets_are_one_line_errors(lab, tmp_path):
    for path, says in ((tmp_path / "usage.txt", "is not a .png file name"),
                       (tmp_path / "nowhere" / "usage.png", "cannot write into")):
        proc = cli(lab, "report", "--plot", str(path))
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr

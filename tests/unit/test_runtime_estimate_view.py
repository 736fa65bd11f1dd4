"""``queue why``'s run-time estimate: the one placement makes (``estimate_runtime``) from the
lab's history in the database (real SQLite), per user and label, as the round reads it."""
from __future__ import annotations

import os
import pwd
import time

from iadeep_cli import messages as m
from iadeep_cli.cli.queue import runtime_text
from iadeep_cli.controller import runtimes
from iadeep_cli.controller.requests.views import StoreReader
from iadeep_cli.jobs import JobSpec, JobState
from iadeep_cli.store import Store, jobrows

ME = pwd.getpwuid(os.getuid()).pw_name


def _ran(conn, owner: str, workload: str | None, seconds: float, now: float) -> None:
    job_id, _ = jobrows.insert(conn, owner, JobSpec(script="/a", workload=workload), now)
    conn.execute("UPDATE jobs SET state=?, started_at=?, ended_at=? WHERE id=?",
                 (JobState.SUCCEEDED.value, now - 86400 - seconds, now - 86400, job_id))


def test_the_estimate_comes_from_the_owners_history_of_the_label_then_the_labels(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    now = time.time()
    with store.tx() as conn:
        for seconds in (3 * 3600, 2.5 * 3600, 4 * 3600, 3 * 3600):
            _ran(conn, ME, "bert", seconds, now)
        for seconds in (600, 700, 800):
            _ran(conn, "other", "bert", seconds, now)
        mine, _ = jobrows.insert(conn, ME, JobSpec(script="/a", workload="bert"), now)
        theirs, _ = jobrows.insert(conn, "newcomer", JobSpec(script="/a", workload="bert"), now)
        capped, _ = jobrows.insert(conn, ME, JobSpec(script="/a", workload="bert",
                                                     time_limit_s=600), now)
        done, _ = jobrows.insert(conn, ME, JobSpec(script="/a", workload="bert"), now)
        conn.execute("UPDATE jobs SET state='cancelled' WHERE id=?", (done,))
    reader = StoreReader(store)

    detail = reader.job(mine)
    assert detail.runtime is not None and detail.runtime.source == "user+label history"
    assert 2 * 3600 < detail.runtime.seconds < 4 * 3600
    assert detail.runtime.low_s < detail.runtime.seconds < detail.runtime.high_s
    text = runtime_text(detail.runtime, detail.job)
    assert text.startswith("~") and text.endswith(", from your history of label bert)")
    # the same figures the round plans with (controller/runtimes.py: one reading of history)
    with store.read() as conn:
        assert runtimes.estimate(jobrows.get(conn, mine), runtimes.history(conn, now), now) \
            == detail.runtime

    other = reader.job(theirs)   # no history of their own: the label's, everyone's runs
    assert other.runtime is not None and other.runtime.source == "label history"
    assert runtime_text(other.runtime, other.job).endswith(
        ", from the lab's history of label bert)")
    assert other.runtime.seconds < detail.runtime.seconds   # the short runs count too

    limited = reader.job(capped)
    assert limited.runtime is not None and limited.runtime.high_s <= 600
    assert "--time" in runtime_text(limited.runtime, limited.job)
    assert reader.job(done).runtime is None   # finished: nothing to estimate
    encoded = m.JobDetail.from_dict(detail.to_dict())   # --json carries it, and back
    assert encoded.runtime == detail.runtime
    assert detail.to_dict()["runtime_estimate"]["source"] == "user+label history"
    store.close()


def test_with_no_history_the_estimate_says_it_is_a_default(tmp_path):
    store = Store(tmp_path / "iadeep.db")
    with store.tx() as conn:
        job_id, _ = jobrows.insert(conn, "newcomer", JobSpec(script="/a"), time.time())
    detail = StoreReader(store).job(job_id)
    assert detail.runtime is not None and detail.runtime.source == "default"
    assert runtime_text(detail.runtime, detail.job).endswith(
        "from a default: no history to go by yet)")
    store.close()

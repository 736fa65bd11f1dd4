"""A job's files never fail a round (issue 41, item 1): a real sshd node with two stand-in GPUs,
a real controller process and the real CLI.

A job writes two well-formed progress lines whose counts differ by a 4,001-digit number (the
attack: before, every round failed from then on, and nothing started). The rounds go on: another
job starts and finishes, `status` shows no failing rounds, and the controller's log names the
attacker's job only if anything of it was skipped. A round that fails anyway is visible: an
in-process controller whose round raises says DEGRADED in `iadeep status` and counts it in the
metrics, until a round completes again.
"""
from __future__ import annotations

import time
import urllib.request

from helpers.controllers import (
    cli,
    fake_gpu_lab,
    queue_add,
    rounds_after,
    wait_jobs,
    wait_until,
)

ATTACK = ("#!/bin/sh\nT=$(date +%s)\nprintf '%s 1\\n' \"$T\" >> \"$IADEEP_PROGRESS_FILE\"\n"
          "printf '%s 1' $((T + 1)) >> \"$IADEEP_PROGRESS_FILE\"\n"
          "printf '0%.0s' $(seq 4000) >> \"$IADEEP_PROGRESS_FILE\"\n"
          "echo >> \"$IADEEP_PROGRESS_FILE\"\ntouch \"$1\"\nexec sleep 600\n")


def test_a_progress_file_with_a_4001_digit_count_stops_no_round(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, gpus=2) as lab:
        home = lab.home
        attack = tmp_path / "attack.sh"
        attack.write_text(ATTACK)
        attack.chmod(0o755)
        written = tmp_path / "written"
        bad = queue_add(home, str(attack), str(written), "--workload", "mlp", "--exclusive")
        wait_until(written.exists, limit=120)
        # the lines are on the node: a few whole rounds that began once the job was running
        # with them written read them before the next job (before, each round failed from its
        # first read of them, and nothing started again)
        wait_jobs(home, lambda js: js[bad]["state"] == "running")
        rounds_after(home, time.time(), rounds=3)
        honest = tmp_path / "honest.sh"
        honest.write_text("#!/bin/sh\necho done\n")
        honest.chmod(0o755)
        other = queue_add(home, str(honest))
        jobs = wait_jobs(home, lambda js: js[other]["state"] in ("succeeded", "failed"),
                         timeout=120)
        assert jobs[other]["state"] == "succeeded" and jobs[bad]["state"] == "running"
        shown = cli(home, "status", check=True).stdout
        assert "controller: running" in shown and "DEGRADED" not in shown
        assert "scheduling round failed" not in lab.log.read_text()
        cli(home, "queue", "cancel", str(bad), check=True)


class _FailingLoop:
    """A scheduling loop whose round raises, as a bug would (what the runtime must show)."""

    def __init__(self) -> None:
        self.fail = True

    def tick(self) -> None:
        if self.fail:
            raise OverflowError("int too large to convert to float")

    def close(self) -> None:
        pass


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read().decode()


def test_rounds_that_fail_show_as_degraded_and_are_counted(tmp_path):
    from iadeep_cli.controller.runtime import Controller
    from iadeep_cli.inventory import Inventory

    home = tmp_path / "state"
    ctl = Controller(Inventory(nodes=()), home, metrics=("127.0.0.1", 0))
    ctl._serve_metrics()
    ctl.socket.start()
    assert ctl.metrics is not None
    loop = ctl.loop = _FailingLoop()   # type: ignore[assignment]
    try:
        for _ in range(3):
            ctl._tick()
        ctl.heartbeat()
        shown = cli(home, "status").stdout
        assert "controller: running" in shown
        assert ("DEGRADED: scheduling rounds failing: the last 3 failed, since "
                in shown), shown
        assert "(OverflowError: int too large to convert to float); nothing is placed" in shown
        assert "iadeep_rounds_failed_total 3.0" in _scrape(ctl.metrics.url)
        loop.fail = False   # a round completes again: no longer degraded, the count stays
        ctl._tick()
        ctl.heartbeat()
        assert "DEGRADED" not in cli(home, "status").stdout
        assert "iadeep_rounds_failed_total 3.0" in _scrape(ctl.metrics.url)
    finally:
        ctl.loop = None
        ctl.metrics.close()
        ctl.socket.close()
        ctl.store.close()

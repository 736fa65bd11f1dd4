"""A job that swaps its log between a regular file and a FIFO as fast as it can, on an
ordinary (`run_as: account`) real sshd node, while its log is read again and again: every read
ends at once with the bytes or a clear error, and no reader is left blocked on the node. Over
SFTP the server's open came after its stat: a FIFO swapped in between blocked it for good."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_launcher_sshd import make_job, pool  # noqa: F401  (the fixture)

from helpers.controllers import wait_until
from helpers.sshd import _descendants
from iadeep_cli.errors import NodeError
from iadeep_cli.nodes.shell import backend as L

pytestmark = pytest.mark.sshd

SWAPS_ITS_LOG = """#!/bin/sh
cd "$(dirname "$IADEEP_PROGRESS_FILE")" || exit 1
while [ ! -e "$1" ]; do
  printf 'line\\n' > r.tmp; mv -f r.tmp log; mkfifo f.tmp; mv -f f.tmp log
done
"""


def _stuck_readers(sshd_pid: int) -> list[int]:
    """Processes under the node's sshd reading files for iadeep (an SFTP server, a ``dd``):
    none is left once every read ended."""
    out = []
    for pid in _descendants(sshd_pid):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm in ("sftp-server", "dd"):
            out.append(pid)
    return out


def test_reading_a_log_the_job_swaps_for_a_fifo_never_blocks(pool, sshd_cluster,  # noqa: F811
                                                             tmp_path):
    release = tmp_path / "release"
    job, script = make_job(tmp_path, 170, SWAPS_ITS_LOG, args=(str(release),))
    L.launch(pool, "node01", job, [0], script)
    got, refused = 0, []
    try:
        for _ in range(40):
            try:
                L.read_log(pool, "node01", 170)
                got += 1
            except NodeError as exc:   # a FIFO there, or swapped during the read: said so
                refused.append(exc.message)
                if "no answer within" in exc.message:
                    break              # a reader blocked on the node: no use going on
    finally:
        release.touch()
    assert not [m for m in refused if "no answer within" in m], refused
    sshd = sshd_cluster(2, key="jobs").node("node01").proc
    assert sshd is not None
    wait_until(lambda: _stuck_readers(sshd.pid) == [], limit=30)
    assert got + len(refused) == 40

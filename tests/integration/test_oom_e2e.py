"""Out of GPU memory, named, end to end: a real sshd node with one GPU (the stand-in
nvidia-smi), a real controller process, two jobs that share the GPU, and one of them dying with
PyTorch's out-of-memory traceback. It fails with that reason and whom it shared with, its retry
runs alone (it waits while its partner holds the only GPU), and the pair is recorded as unsafe
for the model.
"""
from __future__ import annotations

import json
import sqlite3
import sys

import pytest

from helpers.controllers import cli, fake_gpu_lab, jobs_by_id, queue_add, wait_jobs, wait_until

# What PyTorch prints when an allocation fails (torch 2.x), the traceback's last lines.
TORCH_OOM = (
    'Traceback (most recent call last):\n  File "train.py", line 42, in <module>\n'
    "    loss = model(x).sum()\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    "total capacity of 139.81 GiB of which 1.25 GiB is free. Including non-PyTorch memory, "
    "this process has 60.12 GiB memory in use.\n")

# Runs until the file argv[1] exists, writing progress; with argv[2] (a marker file) its first
# attempt dies of the out-of-memory error instead, the second runs like the others.
JOB = f"""#!{sys.executable}
import os, sys, time
stop, start = sys.argv[1], time.time()
if len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):
    open(sys.argv[2], "w").close()
    time.sleep(0.5)
    sys.stderr.write({TORCH_OOM!r})
    sys.exit(1)
path = os.environ.get("IADEEP_PROGRESS_FILE")
while not os.path.exists(stop):
    time.sleep(0.05)
    if path:
        with open(path, "a") as f:
            f.write(f"{{time.time():.6f}} {{int((time.time() - start) * 1000)}}\\n")
"""


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, lab="node_grace: 30") as ctl:
        yield ctl


def _events(home, job_id: int) -> list[dict]:
    return json.loads(cli(home, "queue", "show", str(job_id), "--json", check=True).stdout
                      )["events"]


def test_out_of_memory_while_sharing_is_named_and_retried_alone(lab, tmp_path):
    home = lab.home
    script = tmp_path / "train.py"
    script.write_text(JOB)
    script.chmod(0o755)
    stop_a, stop_b = tmp_path / "stop-a", tmp_path / "stop-b"
    a = queue_add(home, str(script), str(stop_a), "--workload", "mlp")
    wait_jobs(home, lambda js: js[a]["state"] == "running")
    b = queue_add(home, str(script), str(stop_b), str(tmp_path / "b-tried"),
                  "--workload", "mlp", "--retries", "1")
    # B shares A's GPU (mlp with mlp: 0.90 each), runs out of memory, and is queued again
    wait_until(lambda: any(e["new_state"] == "lost" and "out of GPU memory" in e["reason"]
                           for e in _events(home, b)), limit=120)
    jobs = jobs_by_id(home)
    assert (tmp_path / "b-tried").exists()
    failure = next(e["reason"] for e in _events(home, b) if e["new_state"] == "lost")
    node = jobs[a]["node"]
    assert failure == (f"out of GPU memory (exit code 1) while sharing GPU {node}:0 with job "
                       f"{a} (mlp); runs alone from now on")
    assert jobs[b]["exclusive"] is True and jobs[a]["state"] == "running"
    # its second attempt waits for a GPU of its own: A keeps the only one
    wait_jobs(home, lambda js: js[b]["state"] == "queued" and js[b]["reason"]
              and "requeued" not in js[b]["reason"])
    assert jobs_by_id(home)[b]["attempts"] == 1
    # the model's store learnt the pair is unsafe
    with sqlite3.connect(home / "iadeep.db") as db:
        rows = db.execute("SELECT jobs, speeds FROM colocations").fetchall()
    assert [(json.loads(j), json.loads(s)) for j, s in rows] == [(["mlp", "mlp"],
                                                                  [0.05, 0.05])]
    stop_a.touch()
    jobs = wait_jobs(home, lambda js: js[b]["state"] == "running")
    assert jobs[a]["state"] == "succeeded" and jobs[b]["attempts"] == 2
    stop_b.touch()
    jobs = wait_jobs(home, lambda js: js[b]["state"] in ("succeeded", "failed"))
    assert jobs[b]["state"] == "succeeded"
    starts = [e["at"] for e in _events(home, b) if e["new_state"] == "running"]
    ended_a = jobs[a]["ended_at"]
    assert len(starts) == 2 and starts[1] >= ended_a        # the retry ran alone


def test_out_of_memory_alone_fails_with_the_reason(lab, tmp_path):
    home = lab.home
    script = tmp_path / "oom.sh"
    script.write_text("#!/bin/sh\necho step 1\nprintf '%s' \"$OOM\" >&2\nexit 1\n")
    job = queue_add(home, str(script), "--env", f"OOM={TORCH_OOM}", "--retries", "1")
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\necho 'no memory problem here'\nexit 1\n")
    other = queue_add(home, str(plain))
    jobs = wait_jobs(home, lambda js: {js[job]["state"], js[other]["state"]} == {"failed"})
    assert jobs[job]["reason"] == "out of GPU memory (exit code 1)"
    assert jobs[job]["attempts"] == 1 and jobs[job]["exclusive"] is False   # its own doing
    assert jobs[other]["reason"] == "exited with code 1"

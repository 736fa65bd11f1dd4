"""The plain-PyTorch hook end to end: a real sshd node, a real controller, the real CLI.

A ``--requeue --checkpoint-signal USR2`` job trains a tiny torch model with
``integrations.torch.Checkpointer``. On its first attempt it waits inside step HOLD_AT until
the checkpoint signal has come (the hook's flag), so the signal lands mid-step; `queue requeue`
sends it. The hook listens for USR2 because iadeep says so ($IADEEP_CHECKPOINT_SIGNAL; USR2's
default action would kill the job instead), saves at the end of that step, exits with
REQUEUE_EXIT_CODE; iadeep requeues it without spending a retry, and the second attempt
resumes at that step: every step is trained exactly once over the two attempts.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from helpers.controllers import cli, fake_gpu_lab, queue_add, wait_jobs, wait_until
from iadeep_cli.integrations import REQUEUE_EXIT_CODE

REPO = Path(__file__).resolve().parents[2]
STEPS = 12
HOLD_AT = 4

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed: `make torch-cpu`")

JOB = f"""#!{sys.executable}
import os, sys, time
sys.path.insert(0, {str(REPO)!r})
import torch
from iadeep_cli.integrations.torch import Checkpointer

def say(text):
    print(text, flush=True)
    with open("said", "a") as f:
        f.write(text + "\\n")

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
ck = Checkpointer("ckpt.pt", model=model, optimizer=opt, total_steps={STEPS})
start = ck.resume()
restart = os.environ["IADEEP_RESTART_COUNT"]
say(f"start at step {{start}}, restart {{restart}}, "
    f"signal {{os.environ.get('IADEEP_CHECKPOINT_SIGNAL')}}")
for step in range(start, {STEPS}):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if step + 1 == {HOLD_AT} and restart == "0":
        open("holding", "w").close()
        while not ck.requested:          # the signal lands here, in the middle of the step
            time.sleep(0.05)
    loss.backward()
    opt.step()
    with open("steps.log", "a") as f:
        f.write(f"{{step + 1}}\\n")
    ck.step_done(step + 1)
say("done")
"""


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, lab="node_grace: 30\nkill_grace: 2\n"
                      "policy: {preempt_grace: 120}") as ctl:
        yield ctl


def test_a_torch_loop_with_the_hook_is_requeued_and_resumes_at_the_step_it_saved(lab,
                                                                                 tmp_path):
    home = lab.home
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "train.py"
    script.write_text(JOB)
    script.chmod(0o755)
    job = queue_add(home, str(script), "--requeue", "--checkpoint-signal", "USR2",
                    "--retries", "0", "--chdir", str(work))
    wait_until(lambda: (work / "holding").exists(), limit=180)
    cli(home, "queue", "requeue", str(job), check=True)
    jobs = wait_jobs(home, lambda js: js[job]["state"] in ("succeeded", "failed", "cancelled"),
                     timeout=300)
    assert jobs[job]["state"] == "succeeded"
    assert (jobs[job]["attempts"], jobs[job]["checkpoints"]) == (2, 1)   # no retry spent
    import torch
    assert torch.load(work / "ckpt.pt", weights_only=False)["step"] == HOLD_AT
    assert (work / "said").read_text().splitlines() == [
        "start at step 0, restart 0, signal USR2", f"start at step {HOLD_AT}, restart 1, "
        "signal USR2", "done"]
    assert (work / "steps.log").read_text().split() == [str(i) for i in range(1, STEPS + 1)]
    events = json.loads(cli(home, "queue", "show", str(job), "--json", check=True).stdout)[
        "events"]
    reasons = [e["reason"] for e in events]
    assert sum("SIGUSR2 sent" in r for r in reasons) == 1, reasons
    assert any(r.startswith(f"checkpointed on SIGUSR2 (exit code {REQUEUE_EXIT_CODE}); ")
               for r in reasons), reasons

"""The framework hooks (iadeep_cli/integrations) with the real libraries, on the CPU.

Each job is a real process training a tiny model built in code (no download) on data made
here. At step HOLD_AT it waits inside the step (inside the model's forward pass) until ./go
exists; the test sends SIGUSR1 while it waits, then lets it go on. The hook must save at the end
of that step (a save inside the handler would hold one step less, from half-done work), exit
with REQUEUE_EXIT_CODE, and on the next start (IADEEP_RESTART_COUNT=1) resume at that step.
Each step the job trains is appended to ./steps.log, over both attempts. A library that is not
installed skips its test and says so (`make frameworks` installs them; docs/contributing.md).
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from iadeep_cli.integrations import REQUEUE_EXIT_CODE
from iadeep_cli.progress import parse_progress, parse_total

REPO = Path(__file__).resolve().parents[2]
HOLD_AT = 3
STEPS = 8

# Every job starts with this: trained(step) logs the step and holds at HOLD_AT until ./go.
PREAMBLE = '''
import os, sys, time
HOLD = int(os.environ.get("HOLD_AT") or 0)

def trained(step):
    with open("steps.log", "a") as f:
        f.write(f"{step}\\n")
    if step == HOLD:
        open("holding", "w").close()
        while not os.path.exists("go"):
            time.sleep(0.02)
'''

PLAIN = PREAMBLE + f'''
import torch
from iadeep_cli.integrations.torch import Checkpointer

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
step_now = 0
model.register_forward_pre_hook(lambda m, a: trained(step_now))
ck = Checkpointer("ckpt.pt", model=model, optimizer=opt, total_steps={STEPS}, every_s=0)
start = ck.resume()
print("start at step", start, flush=True)
for step in range(start, {STEPS}):
    step_now = step + 1
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    ck.step_done(step + 1)
print("done", flush=True)
'''

LIGHTNING = PREAMBLE + f'''
import torch
import lightning as L
from iadeep_cli.integrations.lightning import IadeepCallback

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        trained(self.global_step + 1)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
iadeep = IadeepCallback("ckpt/requeue.ckpt", every_s=0)
print("start from", iadeep.resume_from, flush=True)
trainer = L.Trainer(max_steps={STEPS}, accelerator="cpu", logger=False, callbacks=[iadeep],
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(Tiny(), loader, ckpt_path=iadeep.resume_from)
print("done", flush=True)
'''

TRANSFORMERS = PREAMBLE + f'''
import torch
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,
                          TrainingArguments)
from iadeep_cli.integrations.transformers import IadeepTrainerCallback, last_checkpoint

torch.manual_seed(0)
config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16)
model = BertForSequenceClassification(config)
data = [{{"input_ids": torch.randint(0, 50, (8,)), "labels": torch.tensor(i % 2)}}
        for i in range(64)]
step_now = [0]

class Counter(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        step_now[0] = state.global_step + 1

model.register_forward_pre_hook(lambda m, a: trained(step_now[0]))
args = TrainingArguments(output_dir="out", max_steps={STEPS}, per_device_train_batch_size=4,
                         save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                         logging_strategy="no")
trainer = Trainer(model=model, args=args, train_dataset=data,
                  callbacks=[Counter(), IadeepTrainerCallback(every_s=0)])
print("start from", last_checkpoint("out"), flush=True)
trainer.train(resume_from_checkpoint=last_checkpoint("out"))
print("done", flush=True)
'''

KERAS = PREAMBLE + '''
import numpy as np
import keras
from iadeep_cli.integrations.keras import IadeepKerasCallback

class Hold(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        trained(int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) + 1)

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
x, y = np.random.rand(16, 4), np.random.rand(16, 1)
iadeep = IadeepKerasCallback("ckpt", every_s=0)
print("start at epoch", iadeep.initial_epoch, flush=True)
model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
          initial_epoch=iadeep.initial_epoch, callbacks=[Hold(), iadeep])
print("done at step", int(keras.ops.convert_to_numpy(model.optimizer.iterations)), flush=True)
'''


def _needs(*modules: str) -> None:
    """Skip, saying which library is missing, unless each is installed (not imported here:
    the job imports it, in its own process)."""
    for name in modules:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed: `make frameworks` installs torch (CPU), "
                        "lightning, transformers and keras")


def _load(path: Path) -> dict:
    import torch
    return torch.load(path, weights_only=False)


def _attempt(work: Path, source: str, restart: int, hold: bool) -> subprocess.CompletedProcess:
    """Run the job once in ``work``; when ``hold``, signal it while it holds at HOLD_AT."""
    job = work / "job.py"
    job.write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": str(REPO), "IADEEP_PROGRESS_FILE": str(work / "progress"),
           "IADEEP_RESTART_COUNT": str(restart), "HOLD_AT": str(HOLD_AT if hold else 0),
           "KERAS_BACKEND": "torch", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "0",
           "HF_HUB_OFFLINE": "1"}
    env.pop("IADEEP_CHECKPOINT_SIGNAL", None)
    proc = subprocess.Popen([sys.executable, str(job)], cwd=work, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if hold:
        while not (work / "holding").exists():   # pytest-timeout ends a job that never holds
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"the job ended before step {HOLD_AT}:\n{out}\n{err}")
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        (work / "go").touch()
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _signalled_then_resumed(tmp_path: Path, source: str):
    """Both attempts: (first, second, steps.log by attempt, progress lines, total)."""
    first = _attempt(tmp_path, source, 0, hold=True)
    assert first.returncode == REQUEUE_EXIT_CODE, first.stderr[-3000:]
    steps_first = (tmp_path / "steps.log").read_text().split()
    progress_first = [i for _, i in parse_progress((tmp_path / "progress").read_text())]
    second = _attempt(tmp_path, source, 1, hold=False)
    assert second.returncode == 0, second.stderr[-3000:]
    steps = (tmp_path / "steps.log").read_text().split()
    text = (tmp_path / "progress").read_text()
    progress = [i for _, i in parse_progress(text)]
    return (first, second, (steps_first, steps[len(steps_first):]),
            (progress_first, progress[len(progress_first):]), parse_total(text))


def test_a_plain_torch_loop_saves_at_the_end_of_the_signalled_step_and_resumes_there(tmp_path):
    _needs("torch")
    first, second, steps, progress, total = _signalled_then_resumed(tmp_path, PLAIN)
    saved = _load(tmp_path / "ckpt.pt")
    assert saved["step"] == HOLD_AT   # the step it was in when signalled, finished
    assert "start at step 0" in first.stdout and "done" not in first.stdout
    assert "start at step 3" in second.stdout and "done" in second.stdout
    assert steps == ([str(i) for i in range(1, HOLD_AT + 1)],
                     [str(i) for i in range(HOLD_AT + 1, STEPS + 1)])
    assert progress[0] == list(range(0, HOLD_AT + 1))
    assert progress[1] == list(range(HOLD_AT, STEPS + 1))
    assert total == STEPS
    assert not list(tmp_path.glob(".ckpt.pt.*"))   # the temporary was renamed, not left


def test_a_lightning_callback_checkpoints_at_a_batch_end_and_fit_resumes_there(tmp_path):
    _needs("torch", "lightning")
    first, second, steps, progress, total = _signalled_then_resumed(tmp_path, LIGHTNING)
    saved = _load(tmp_path / "ckpt" / "requeue.ckpt")
    assert saved["global_step"] == HOLD_AT
    assert "start from None" in first.stdout and "done" not in first.stdout
    assert "requeue.ckpt" in second.stdout and "done" in second.stdout
    assert steps == ([str(i) for i in range(1, HOLD_AT + 1)],
                     [str(i) for i in range(HOLD_AT + 1, STEPS + 1)])
    assert progress[0][0] == 0 and progress[0][-1] == HOLD_AT
    assert progress[1][0] == HOLD_AT and progress[1][-1] == STEPS
    assert total == STEPS


def test_a_transformers_trainer_callback_saves_a_trainer_checkpoint_and_resumes(tmp_path):
    _needs("torch", "transformers", "accelerate")
    first, second, steps, progress, total = _signalled_then_resumed(tmp_path, TRANSFORMERS)
    assert [p.name for p in (tmp_path / "out").glob("checkpoint-*")] == [f"checkpoint-{HOLD_AT}"]
    assert "start from None" in first.stdout and "done" not in first.stdout
    assert f"checkpoint-{HOLD_AT}" in second.stdout and "done" in second.stdout
    assert steps == ([str(i) for i in range(1, HOLD_AT + 1)],
                     [str(i) for i in range(HOLD_AT + 1, STEPS + 1)])
    assert progress[0][0] == 0 and progress[0][-1] == HOLD_AT
    assert progress[1][0] == HOLD_AT and progress[1][-1] == STEPS
    assert total == STEPS


def test_a_keras_callback_saves_weights_and_optimiser_at_a_batch_end_and_resumes(tmp_path):
    """Keras restarts the interrupted epoch from its first batch (as its BackupAndRestore),
    from the weights and optimiser step saved mid-epoch: 4 batches an epoch, 2 epochs."""
    _needs("torch", "keras")   # on the torch backend
    first, second, steps, progress, total = _signalled_then_resumed(tmp_path, KERAS)
    assert json.loads((tmp_path / "ckpt" / "requeue.json").read_text()) == {
        "epoch": 0, "batch": HOLD_AT, "step": HOLD_AT}
    assert "start at epoch 0" in first.stdout and "done" not in first.stdout
    # resumed at the saved optimiser step; epoch 0 again (4 batches), then epoch 1 (4)
    assert steps[0] == [str(i) for i in range(1, HOLD_AT + 1)]
    assert steps[1] == [str(i) for i in range(HOLD_AT + 1, HOLD_AT + 9)]
    assert progress[1][0] == HOLD_AT
    assert f"done at step {HOLD_AT + 8}" in second.stdout
    assert total == STEPS

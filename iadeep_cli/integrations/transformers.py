"""A Hugging Face ``transformers.Trainer`` callback for iadeep: progress, checkpoint, resume.

    from iadeep_cli.integrations.transformers import IadeepTrainerCallback, last_checkpoint

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[IadeepTrainerCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))   # None at first

It reports ``state.global_step`` and ``state.max_steps``; when the checkpoint signal has come,
at the end of the next optimiser step it asks the Trainer to save (its own full checkpoint,
``output_dir/checkpoint-N``: weights, optimiser, scheduler, RNG, trainer state) and, once that
is written, exits with REQUEUE_EXIT_CODE. ``output_dir`` must be in the job's working
directory (``--chdir``), which outlives the attempt.
"""
from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from . import Requeue


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest ``checkpoint-N`` in ``output_dir`` (None when there is none, or no dir)."""
    if not os.path.isdir(output_dir):
        return None
    return get_last_checkpoint(str(output_dir))


def _any_rank(flag: bool, device: Any) -> bool:
    """True if ``flag`` is true on any process (DDP), so all save at the same step (one
    one-element all-reduce a step, on ``device``: NCCL reduces only tensors on the GPU)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return flag
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class IadeepTrainerCallback(TrainerCallback):
    """Progress to iadeep; after the signal, a Trainer checkpoint at a step end, then exit."""

    def __init__(self, *, signal_name: str | None = None, every_s: float = 1.0) -> None:
        self.requeue = Requeue(signal_name, every_s=every_s)
        self._saving = False

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: object) -> None:
        self.requeue.install()
        self.requeue.total(state.max_steps)
        self.requeue.step_done(state.global_step, force=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: object) -> None:
        self.requeue.step_done(state.global_step)
        if _any_rank(self.requeue.requested, args.device):
            self._saving = True
            control.should_save = True   # the Trainer saves right after this step's callbacks

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: object) -> None:
        if self._saving:
            self.requeue.step_done(state.global_step, force=True)
            self.requeue.exit()

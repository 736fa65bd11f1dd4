"""A PyTorch Lightning callback for iadeep: progress, checkpoint on the signal, resume.

    from iadeep_cli.integrations.lightning import IadeepCallback

    iadeep = IadeepCallback("ckpt/requeue.ckpt")
    trainer = L.Trainer(max_steps=1000, callbacks=[iadeep])
    trainer.fit(model, ckpt_path=iadeep.resume_from)   # None on a first start

It reports ``trainer.global_step`` and ``trainer.estimated_stepping_batches``; when the
checkpoint signal has come, at the end of the next training batch it saves with
``trainer.save_checkpoint`` (Lightning's full checkpoint: weights, optimisers, loops) and exits
with REQUEUE_EXIT_CODE. With several processes (DDP) they agree first (any rank's signal
counts), so all save at the same step. On a Slurm backend, give the trainer
``plugins=[SLURMEnvironment(auto_requeue=False)]``: iadeep requeues, not Lightning.
"""
from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from . import Requeue, atomic_path


class IadeepCallback(Callback):
    """Progress to iadeep, and a checkpoint and exit at a batch end after the signal."""

    def __init__(self, path: str | os.PathLike[str] = "requeue.ckpt", *,
                 signal_name: str | None = None, every_s: float = 1.0) -> None:
        super().__init__()
        self.path = path
        self.requeue = Requeue(signal_name, every_s=every_s)

    @property
    def resume_from(self) -> str | None:
        """The checkpoint to pass to ``trainer.fit(ckpt_path=...)``: the saved one, or None."""
        final, _ = atomic_path(self.path)
        return str(final) if final.exists() else None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.requeue.install()   # after Lightning's own signal handlers, which replace ours
        self.requeue.total(trainer.estimated_stepping_batches)
        self.requeue.step_done(trainer.global_step, force=True)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self.requeue.step_done(trainer.global_step)
        if not trainer.strategy.reduce_boolean_decision(self.requeue.requested, all=False):
            return
        final, tmp = atomic_path(self.path)
        trainer.save_checkpoint(tmp)
        if trainer.is_global_zero:
            os.replace(tmp, final)
        trainer.strategy.barrier("iadeep-requeue")
        self.requeue.step_done(trainer.global_step, force=True)
        self.requeue.exit()

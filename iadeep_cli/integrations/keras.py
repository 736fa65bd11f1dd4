"""A Keras 3 callback for iadeep: progress, checkpoint on the signal, resume.

    from iadeep_cli.integrations.keras import IadeepKerasCallback

    iadeep = IadeepKerasCallback("ckpt")      # a directory in the job's working directory
    model.fit(x, y, epochs=10, initial_epoch=iadeep.initial_epoch, callbacks=[iadeep])

It reports the optimiser's step (``optimizer.iterations``) and epochs x steps per epoch; when
the checkpoint signal has come, at the end of the next batch it saves the weights and the
optimiser's state (``ckpt/requeue.weights.h5``) and where it was (``ckpt/requeue.json``), then
exits with REQUEUE_EXIT_CODE. On the next start it loads them when training begins. Keras
cannot start an epoch in its middle (its own ``BackupAndRestore`` neither): the interrupted
epoch runs again from its first batch, from the weights and optimiser step saved mid-epoch.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import keras

from . import Requeue

WEIGHTS = "requeue.weights.h5"   # Keras 3 wants the .weights.h5 ending
META = "requeue.json"


class IadeepKerasCallback(keras.callbacks.Callback):
    """Progress to iadeep; after the signal, weights and optimiser saved at a batch end."""

    def __init__(self, directory: str | os.PathLike[str] = "requeue-ckpt", *,
                 signal_name: str | None = None, every_s: float = 1.0) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.requeue = Requeue(signal_name, every_s=every_s)
        self._epoch = 0

    def saved(self) -> dict[str, Any] | None:
        """What the last checkpoint says (``epoch``, ``step``), None without one."""
        try:
            return dict(json.loads((self.directory / META).read_text()))
        except (OSError, ValueError):
            return None

    @property
    def initial_epoch(self) -> int:
        """``fit(initial_epoch=...)``: the epoch the checkpoint was taken in, else 0."""
        saved = self.saved()
        return int(saved["epoch"]) if saved else 0

    def _step(self) -> int:
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.requeue.install()
        if self.saved() is not None:
            if not self.model.optimizer.built:   # its variables must exist to be loaded into
                self.model.optimizer.build(self.model.trainable_variables)
            self.model.load_weights(self.directory / WEIGHTS)
        steps, epochs = self.params.get("steps"), self.params.get("epochs")
        if steps and epochs:
            self.requeue.total(steps * epochs)
        self.requeue.step_done(self._step(), force=True)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = self._step()
        self.requeue.step_done(step)
        if not self.requeue.requested:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{os.getpid()}.{WEIGHTS}"
        self.model.save_weights(tmp)
        os.replace(tmp, self.directory / WEIGHTS)
        meta = self.directory / f".{os.getpid()}.{META}"
        meta.write_text(json.dumps({"epoch": self._epoch, "batch": batch + 1, "step": step}))
        os.replace(meta, self.directory / META)   # last: it says the weights are whole
        self.requeue.step_done(step, force=True)
        self.requeue.exit()

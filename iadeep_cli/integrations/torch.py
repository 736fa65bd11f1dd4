"""A plain PyTorch training loop under iadeep: progress, checkpoint on the signal, resume.

    from iadeep_cli.integrations.torch import Checkpointer

    ck = Checkpointer("ckpt.pt", model=model, optimizer=opt, total_steps=1000)
    for step in range(ck.resume(), 1000):      # 0, or the step the last attempt saved
        train_one_step(step)
        ck.step_done(step + 1)                 # on the signal: saves, exits to be requeued

Anything with ``state_dict()``/``load_state_dict()`` (models, optimisers, schedulers, a
GradScaler) can be passed by name; ``extra`` keeps plain values (an epoch, a data position).
"""
from __future__ import annotations

import os
from typing import Any

import torch

from . import Requeue, atomic_path


class Checkpointer(Requeue):
    """Saves ``{"step": n, "extra": {...}, name: obj.state_dict(), ...}`` to ``path`` with
    ``torch.save`` (atomically) when the checkpoint signal has come and a step ends."""

    def __init__(self, path: str | os.PathLike[str], *, total_steps: int | None = None,
                 signal_name: str | None = None, every_s: float = 1.0,
                 **stateful: Any) -> None:
        super().__init__(signal_name, every_s=every_s)
        self.path = path
        self.stateful = stateful
        self.extra: dict[str, Any] = {}
        self.step = 0
        self.total(total_steps)

    def resume(self) -> int:
        """Load the checkpoint if there is one (into the objects given) and return the step to
        start at: the number of steps it had done, 0 without a checkpoint."""
        final, _ = atomic_path(self.path)
        if not final.exists():
            self.step_done(0, force=True)
            return 0
        saved = torch.load(final, map_location="cpu", weights_only=False)
        for name, obj in self.stateful.items():
            if name in saved:
                obj.load_state_dict(saved[name])
        self.extra = dict(saved.get("extra") or {})
        self.step = int(saved["step"])
        self.step_done(self.step, force=True)
        return self.step

    def save(self, step: int) -> None:
        """Write the checkpoint of ``step`` steps done."""
        final, tmp = atomic_path(self.path)
        state = {name: obj.state_dict() for name, obj in self.stateful.items()}
        torch.save({"step": step, "extra": self.extra, **state}, tmp)
        os.replace(tmp, final)

    def step_done(self, step: int, *, force: bool = False) -> None:
        """``step`` steps are done: report them; if the signal came, save and exit."""
        self.step = step
        super().step_done(step, force=force)
        if self.requested:
            self.save(step)
            self.exit()

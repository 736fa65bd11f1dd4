#!/usr/bin/env python3
"""Example iadeep job: a small PyTorch model on synthetic data that reports its progress.

Copy and adapt it. Runs on the GPU if there is one, else on the CPU:

    python jobs/train_pytorch.py --steps 500 --batch-size 128

iadeep sets $IADEEP_PROGRESS_FILE; each progress line ("<unix_time> <iterations_done>") lets the
controller measure how fast the job runs next to others, which improves the interference model.
"""
from __future__ import annotations

import argparse
import os
import time

try:
    from iadeep_cli.progress import report
except ImportError:  # iadeep is not installed on this node: write the same line ourselves
    def report(iterations_done: int, path: str | None = None) -> None:
        target = path or os.environ.get("IADEEP_PROGRESS_FILE")
        if target:
            with open(target, "a", encoding="utf-8") as f:
                f.write(f"{time.time():.3f} {int(iterations_done)}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--report-every", type=int, default=10)
    args = ap.parse_args(argv)

    import torch
    from torch import nn

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch_size, 784, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step % args.report_every == 0 or step == args.steps:
            if device == "cuda":
                torch.cuda.synchronize()
            report(step)
    print(f"done: {args.steps} steps on {device}, last loss {loss.item():.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

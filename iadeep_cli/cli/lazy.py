"""Modules the commands load on their first use, not at start-up.

Every ``iadeep`` command imports every command module (cli/main.py registers them all on one
app), so what those modules import at their top is paid by every command. The request and reply
types (messages.py, some 120 dataclasses) and the client cost ~0.1 s of start-up on the 2-core
test machine, which the commands that never talk to the controller (report, sim, model,
monitor) need not pay: ``iadeep report`` must answer in under a second
(benchmarks/bench_report.py). The standard library's LazyLoader runs a module's code on its first
attribute access; type checkers and readers see the plain imports.
"""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING


def lazy(name: str) -> ModuleType:
    """Module ``name``, executed only when one of its attributes is first read (at once if
    something imported it already)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from .. import messages
    from ..controller import client
else:
    messages = lazy("iadeep_cli.messages")
    client = lazy("iadeep_cli.controller.client")

__all__ = ["client", "lazy", "messages"]

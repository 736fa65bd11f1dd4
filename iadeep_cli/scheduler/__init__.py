"""Placement policy: a pure function shared by the controller and the simulator."""
from .placement import (  # noqa: F401
    CachedModel,
    GpuSlot,
    Placement,
    Plan,
    effective_priority,
    order_queue,
    plan,
    slots_from_snapshot,
)

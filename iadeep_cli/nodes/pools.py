"""The controller's pool for an inventory, whatever backends its nodes use: the one place that
knows which backends exist beyond the shell (``NodePool``), so that the controller imports
none of them (docs/backends.md)."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from ..errors import ConfigError
from ..settings import Inventory
from .connection import Pool


def with_backend_nodes(inventory: Inventory) -> Inventory:
    """The inventory with the nodes its batch systems list (a ``slurm:`` partition's, as Slurm
    has them now); the inventory itself when it names none."""
    if inventory.slurm is None:
        return inventory
    if os.geteuid() != 0:
        raise ConfigError(f"{inventory.path}: slurm: the Slurm backend submits each job as its "
                          "owner (sbatch --uid), which only root may do",
                          hint="run the controller as root on a Slurm submit host, or remove "
                               "the slurm: section")
    from .slurm import with_slurm_nodes
    return with_slurm_nodes(inventory)


def with_backends(inventory: Inventory, shell: Pool, install_id: str,
                  attempts: Callable[[Iterable[int]], Mapping[int, int]]) -> Pool:
    """The pool the controller uses: ``shell`` (the SSH ``NodePool`` of the inventory's shell
    nodes) alone, or inside the pool of its batch system (``SlurmPool``), which answers for
    that system's nodes and hands every other to ``shell``. ``attempts``: job ids -> their
    current attempt, how the Slurm backend names each attempt's Slurm job."""
    if inventory.slurm is None:
        return shell
    from .slurm import SlurmPool
    return SlurmPool(inventory, shell, install_id, attempts)

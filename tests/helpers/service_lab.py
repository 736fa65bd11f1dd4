"""The real request service over a real store (SQLite) and files on disk, without a controller
process: one local node, the controller's clock fixed at 1000 s, script copies under the
test's ``tmp_path``. The members are the names the service is told (a real controller takes
them from the socket's peer)."""
from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from iadeep_cli import messages as m
from iadeep_cli.controller.requests.service import Service
from iadeep_cli.jobs import SubmitSpec
from iadeep_cli.settings import Inventory, Node
from iadeep_cli.store import Store


@contextlib.contextmanager
def service_lab(tmp_path: Path) -> Iterator[tuple[Store, Service]]:
    """(the store, the service over it); the store is closed after."""
    store = Store(tmp_path / "iadeep.db")
    nodes = (Node("n1", host="localhost", local=True, workdir=str(tmp_path / "node")),)
    try:
        yield store, Service(store, Inventory(nodes=nodes), lambda: 1000.0,
                             scripts_dir=tmp_path / "scripts")
    finally:
        store.close()


def submit(service: Service, user: str, script: Path, **spec: Any) -> int:
    """``queue add`` of ``script`` (as it is on disk, its content sent along) by ``user``;
    the job's id."""
    request = m.AddRequest(SubmitSpec.from_dict({"script": str(script), **spec}),
                           script_b64=base64.b64encode(script.read_bytes()).decode())
    return service.op_add(user, request).id

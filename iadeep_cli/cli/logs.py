"""`iadeep logs ID [--follow]`: a job's output, fetched by the controller from its node."""
from __future__ import annotations

import sys
import time

import typer

from .. import messages as m
from ..controller import client
from .main import app


@app.command("logs")
def logs(job_id: int = typer.Argument(..., help="Job id."),
         follow: bool = typer.Option(False, "--follow", "-f",
                                     help="Keep printing new output until the job ends.")) -> None:
    """Print a job's stdout and stderr (the CLI never opens SSH itself; the controller does)."""
    offset = 0
    while True:
        chunk = client.ask(m.LogsRequest(job_id, offset))
        if chunk.data:
            sys.stdout.write(chunk.data)
            sys.stdout.flush()
        offset = chunk.offset
        if not follow or (chunk.finished and not chunk.data):
            return
        if not chunk.data:
            time.sleep(1.0)

"""Registers every command module on the main app: a group via add_typer, or a module whose
commands decorate the main app directly (status, logs, sim, monitor)."""
from . import status, logs, monitor, sim  # noqa: F401,I001  (this order is --help's order)
from . import controller, model, nodes, profile, queue
from .main import app

app.add_typer(queue.app, name="queue")
app.add_typer(controller.app, name="controller")
app.add_typer(model.app, name="model")
app.add_typer(nodes.app, name="nodes")
app.add_typer(profile.app, name="profile")

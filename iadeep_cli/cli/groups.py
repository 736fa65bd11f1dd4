"""Registers every command module on the main app. One import (and add_typer) per module."""
from .main import app  # noqa: F401
from . import queue as _queue, status as _status, controller as _controller  # noqa: F401,E401
app.add_typer(_queue.app, name="queue")
app.add_typer(_controller.app, name="controller")
from . import model as _model  # noqa: E402
app.add_typer(_model.app, name="model")

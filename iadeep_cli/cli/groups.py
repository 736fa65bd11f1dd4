"""Registers every command module on the main app. One import (and add_typer) per module."""
from .main import app  # noqa: F401
from . import queue as _queue, status as _status, controller as _controller  # noqa: F401,E401
app.add_typer(_queue.app, name="queue")
app.add_typer(_controller.app, name="controller")
from . import model as _model  # noqa: E402
app.add_typer(_model.app, name="model")
from . import nodes as _nodes
app.add_typer(_nodes.app, name="nodes")
from . import monitor as _monitor  # noqa: F401,E402
from . import sim as _sim  # noqa: F401,E402  (registers `iadeep sim` on the main app)
from . import logs as _logs  # noqa: E402,F401
from . import profile as _profile  # noqa: E402
app.add_typer(_profile.app, name="profile")

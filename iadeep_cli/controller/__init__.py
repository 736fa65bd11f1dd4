"""The controller: the only writer of scheduling state, in two rooms (docs/architecture.md).

- ``round/``: the scheduling round (``loop.py``: poll -> reconcile -> ... -> schedule ->
  launch -> record, each step ``run(round)`` in ``steps/``).
- ``requests/``: what it answers (``service.py`` with permission checks, ``views.py`` the reads
  shared with the offline fallback, ``server.py`` the socket; identity from SO_PEERCRED), given
  a typed port to the rest of the controller (``port.py``).
- beside them, shared: ``runtime.py`` (builds both), ``client.py``/``protocol.py``, notify,
  fair share, reservations, the profile catalog.
"""

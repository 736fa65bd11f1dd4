"""The controller: the only writer of scheduling state.

- ``service``: the requests it answers (add, cancel, hold, ...), with permission checks.
- ``views``: read-only views (queue list, job detail, status) shared with the offline fallback.
- ``server`` / ``client``: the Unix-socket protocol; identity comes from SO_PEERCRED.
- ``loop``: poll -> reconcile -> schedule -> launch -> record.
"""

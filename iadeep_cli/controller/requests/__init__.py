"""The requests the controller answers: the socket (``server.py``), the service and its
handlers (``service.py``, ``admission.py``, ``interactive.py``), the reads (``views.py``, and
``offline.py`` when the controller is down) and the metrics endpoint (``metrics.py``)."""

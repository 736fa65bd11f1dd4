"""`iadeep monitor`: a live Textual view of what the controller recorded.

``viewmodel`` turns the controller's plain data into rows (pure, no Textual); ``source`` fetches
that data (socket or database, never SSH); ``widgets`` and ``app`` draw it. Only ``app`` and
``widgets`` import Textual, and only ``iadeep monitor`` imports them.
"""

"""The scheduling round: the loop (``loop.py``), its steps (``steps/``), what they share
(``context.py``) and the per-node workers (``actions.py``)."""

"""The scheduling round's steps, one module each; ``controller/round/loop.py`` runs them in order
(its docstring lists them and why the order)."""

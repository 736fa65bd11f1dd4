"""iadeep: an interference-aware GPU scheduler for small labs (after IADeep, SC'23).

The core (everything outside ``iadeep_cli.cli`` and ``iadeep_cli.tui``) never imports typer,
textual or rich, so it can be used as a library and keeps the fast commands fast.
"""
__version__ = "0.1.0"

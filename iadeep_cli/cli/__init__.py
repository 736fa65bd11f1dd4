"""The command-line layer: typer apps, one module per command group.

Commands are thin: parse arguments, make one core call, render the result. All error handling
lives in ``cli.errors.run`` so every failure looks the same to the user.
"""

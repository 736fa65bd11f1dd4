"""The one place where core errors become what a user sees: ``Error: ...``, a hint, exit 1."""
from __future__ import annotations

import sys
from typing import Callable, NoReturn

from ..errors import IadeepError
from .render import safe


def report(exc: IadeepError) -> None:
    """One line on stderr: what is wrong, then how to fix it."""
    hint = f" (hint: {exc.hint})" if exc.hint else ""
    print(safe(f"Error: {exc.message}{hint}"), file=sys.stderr)


def fail(exc: IadeepError) -> NoReturn:
    report(exc)
    raise SystemExit(exc.exit_code)


def run(fn: Callable[[], object]) -> None:
    """Call the typer app; map IadeepError and Ctrl-C to a clean exit without a traceback."""
    try:
        fn()
    except IadeepError as exc:
        fail(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130)
    except BrokenPipeError:  # `iadeep queue list | head`
        sys.stderr.close()
        raise SystemExit(0)

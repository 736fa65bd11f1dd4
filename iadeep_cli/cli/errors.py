"""The one place where core errors become what a user sees: ``Error: ...``, a hint, exit 1.

Usage errors (unknown option, missing argument, a value of the wrong type) take the same
one-line form, with exit code 2 as every click/typer program uses for them.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

import typer

# typer >= 0.26 ships its own copy of click; these are the exceptions its parser raises.
from typer._click.exceptions import ClickException, NoArgsIsHelpError, NoSuchOption, UsageError

from ..errors import IadeepError
from .render import safe


def report(exc: IadeepError) -> None:
    """One line on stderr: what is wrong, then how to fix it."""
    hint = f" (hint: {exc.hint})" if exc.hint else ""
    print(safe(f"Error: {exc.message}{hint}"), file=sys.stderr)


def fail(exc: IadeepError) -> NoReturn:
    report(exc)
    raise SystemExit(exc.exit_code)


def usage_error(exc: ClickException) -> IadeepError:
    """click's multi-line usage box as one ``Error:`` line that points at ``--help``."""
    message = exc.format_message()
    hint = None
    if isinstance(exc, UsageError):
        command = exc.ctx.command_path if exc.ctx is not None else "iadeep"
        hint = f"see `{command} --help`"
        if isinstance(exc, NoSuchOption) and exc.possibilities:
            message = exc.message     # without click's "(Possible options: ...)"
            hint = f"did you mean {' or '.join(sorted(exc.possibilities))}? {hint}"
        if isinstance(exc, NoSuchOption) and _takes_script_args(exc):
            hint = (f"options meant for the script go after `--`: {command} SCRIPT -- "
                    f"{exc.option_name} ...; {hint}")
        message, _, guess = message.partition(". Did you mean ")   # typer's, for commands
        if guess:
            hint = f"did you mean {guess} {hint}"
    message = message.strip().rstrip(".")
    err = IadeepError(message[:1].lower() + message[1:], hint)
    err.exit_code = exc.exit_code
    return err


def _takes_script_args(exc: UsageError) -> bool:
    """Whether the command passes arguments on to a job script (``queue add``)."""
    params = exc.ctx.command.params if exc.ctx is not None else []
    return any(p.name == "args" and getattr(p, "nargs", 1) == -1 for p in params)


def run(app: Callable[..., object]) -> None:
    """Call the typer app; map every error a user can cause to one line without a traceback.

    click's standalone mode is off so that usage errors reach us instead of being printed as a
    box; a command's ``typer.Exit(code)`` then comes back as the app's return value. The
    program is named `iadeep` in hints also when started as ``python -m iadeep_cli``.
    """
    try:
        code = app(standalone_mode=False, prog_name="iadeep")
    except NoArgsIsHelpError as exc:   # `iadeep queue`: the help was asked for, in effect
        if exc.format_message():       # (rich has already printed it when installed)
            print(exc.format_message())
        raise SystemExit(exc.exit_code) from None
    except ClickException as exc:
        fail(usage_error(exc))
    except typer.Abort:                # a prompt got end-of-input
        print("Error: aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except IadeepError as exc:
        fail(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except BrokenPipeError:  # `iadeep queue list | head`
        sys.stderr.close()
        raise SystemExit(0) from None
    if isinstance(code, int) and code:
        raise SystemExit(code)

"""One error hierarchy for the whole core.

Every failure a user can cause or meet is an ``IadeepError`` with a one-line ``message`` that
names what is wrong and a ``hint`` that says how to fix it.  The CLI maps these to
``Error: ...`` plus the hint and exit code 1 in exactly one place (``cli.errors``); the core never
prints or exits.  Anything that is *not* an ``IadeepError`` is a bug and may show a traceback.
"""
from __future__ import annotations


class IadeepError(Exception):
    """Base class: a user-facing failure with an optional fix-it hint."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict:
        return {"type": type(self).__name__, "message": self.message, "hint": self.hint}


class ConfigError(IadeepError):
    """The inventory or another settings file is missing, unreadable or invalid."""


class InputError(IadeepError):
    """A command-line argument or input file is invalid (bad --env, negative GPUs, bad CSV...)."""


class NotFoundError(IadeepError):
    """A job, node, profile or file that the user named does not exist."""


class PermissionDenied(IadeepError):
    """The caller may not act on this object (not the owner and not an admin)."""


class InvalidTransition(IadeepError):
    """A job state change that the state machine does not allow (e.g. cancel a finished job)."""


class ControllerUnavailable(IadeepError):
    """The controller is not running or its socket cannot be reached."""


class ControllerBusy(IadeepError):
    """The controller refused a connection at once: too many from this user, or in total."""


class StoreError(IadeepError):
    """The state database is unreadable, locked, or from an unknown (newer) schema version."""


class NodeError(IadeepError):
    """A node could not be reached, refused us, or failed a command (SSH, nvidia-smi)."""


class RunAsRefused(IadeepError):
    """A job cannot run as its submitter on a node (``run_as: submitter``): the account is
    missing there, not allowed, root, the SSH account itself, or sudo refused.  ``node_wide``:
    the node refuses everyone (sudo missing or its rule absent), not just this user."""

    def __init__(self, message: str, hint: str | None = None, node_wide: bool = False):
        super().__init__(message, hint)
        self.node_wide = node_wide


class OwnerFilesError(NodeError):
    """On a ``run_as: submitter`` node, a launch's first steps (its directory, the script's
    copy), run as the job's owner in the owner's home, failed: the home is full or not
    writable. The owner's problem, not the node's: nothing of the job ran, and the node stays
    in use for everyone else."""


class HostKeyError(NodeError):
    """A node's SSH host key is unknown or changed; we never trust it silently."""


class ModelError(IadeepError):
    """An interference model file is missing, corrupt, or built for another version/GPU."""


# Errors that travel over the controller socket are rebuilt on the client side by name.
ERROR_TYPES: dict[str, type[IadeepError]] = {
    cls.__name__: cls
    for cls in (
        IadeepError, ConfigError, InputError, NotFoundError, PermissionDenied,
        InvalidTransition, ControllerUnavailable, ControllerBusy, StoreError, NodeError,
        HostKeyError, ModelError, RunAsRefused,
    )
}


def error_from_dict(data: dict) -> IadeepError:
    """Rebuild an error sent by the controller (unknown type names fall back to the base)."""
    cls = ERROR_TYPES.get(data.get("type", ""), IadeepError)
    return cls(data.get("message", "unknown error"), data.get("hint"))

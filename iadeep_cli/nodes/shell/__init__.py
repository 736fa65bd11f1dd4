"""The shell backend (``BackendKind.SSH``): a POSIX shell on the node, over SSH or on the
controller's own machine, runs each job from a directory of its own (``backend``)."""
from .backend import ShellBackend

__all__ = ["ShellBackend"]

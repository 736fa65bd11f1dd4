"""Checks for values that cross the controller's socket, where nothing can be trusted.

Any local account can send any JSON: a field may have the wrong type (ids sent as the string
"12" would act on jobs 1 and 2), any size, and any characters (a NUL byte makes sshd drop the
node's connection at every launch; an escape sequence in a job name reaches other users'
terminals through ``queue list``). ``typed`` checks a value against the annotation of the
parameter or field it fills, ``text`` what a string may contain; both raise ``InputError``
with one line naming the field. What is shown to users goes through ``escaped`` (an old
database may hold anything): control characters become visible escapes such as ``\\x1b``.
What a job wrote (its log) goes through ``terminal_safe`` / ``TerminalFilter`` instead, which
keeps what a training log needs on a terminal (colours, tabs, carriage returns and backspaces
of progress bars) and escapes the rest, as ``less -R`` does.
"""
from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing

from .errors import IadeepError, InputError, error_from_dict

# C0/C1 controls, DEL, Unicode line separators and bidi overrides: characters that move the
# cursor, recolour or reorder what a terminal shows around them.
_CONTROLS = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
UNSAFE = re.compile(f"[{_CONTROLS}\t\n]")
UNSAFE_IN_VALUES = re.compile(f"[{_CONTROLS}]")   # arguments and --env values may hold \t, \n

INT64 = 2**63 - 1    # SQLite's integers; a larger one would fail deep inside the store
MAX_ITEMS = 10_000   # items in any list of a request
_MALFORMED_HINT = "send requests the way `iadeep` does; is the client the controller's version?"


def text(label: str, value: str, *, max_len: int, multiline: bool = False,
         hint: str = "use printable text") -> str:
    """``value`` if it is at most ``max_len`` characters without control characters (tab and
    newline allowed when ``multiline``); else an InputError naming ``label``."""
    if len(value) > max_len:
        raise InputError(f"{label} is {len(value)} characters long; at most {max_len} are "
                         "accepted", hint=hint)
    bad = (UNSAFE_IN_VALUES if multiline else UNSAFE).search(value)
    if bad:
        raise InputError(f"{label} contains the control character {bad.group()!r} at "
                         f"position {bad.start()}", hint=hint)
    return value


def escape(value: str) -> str:
    """``value`` with every ``UNSAFE`` character written as its escape (``\\x1b``, ``\\n``)."""
    return UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), value)


# What a log may keep on a terminal: SGR (colours, bold: ESC [ digits ; : m) and these controls.
# Every other escape sequence starts with ESC (or a C1 control) and is neutralised by escaping
# that one character visibly: OSC (title, clipboard OSC 52, hyperlinks), DCS, APC, PM, SOS,
# cursor moves, screen and line clears and every other CSI then read as plain text.
LOG_KEEPS = "\t\n\r\b"
_SGR = r"\x1b\[[0-9;:]{0,64}m"
_PARTIAL_SGR = re.compile(r"\x1b(?:\[[0-9;:]{0,64})?\Z")
_LOG_UNSAFE: dict[str, re.Pattern[str]] = {}


def _visible(char: str) -> str:
    return char.encode("unicode_escape").decode("ascii")


def terminal_safe(text: str, keep: str = LOG_KEEPS) -> str:
    """Job-written ``text`` made safe to print on a terminal: SGR colour sequences and the
    controls in ``keep`` stay; every other control character (ESC outside an SGR, C1, BEL,
    DEL, the other C0, line separators, bidi overrides) is written as its escape (``\\x1b``),
    so no OSC, DCS, cursor move or clear can act. Text without controls is returned as is."""
    pattern = _LOG_UNSAFE.get(keep)
    if pattern is None:
        kept = "".join(re.escape(c) for c in keep)
        unsafe = f"[{_CONTROLS}]" if not kept else f"(?![{kept}])[{_CONTROLS}]"
        pattern = _LOG_UNSAFE[keep] = re.compile(f"({_SGR})|{unsafe}")
    return pattern.sub(lambda m: m.group() if m.group(1) else _visible(m.group()), text)


class TerminalFilter:
    """``terminal_safe`` for a log printed a chunk at a time: an SGR sequence cut by a chunk's
    end is held back until the next chunk completes it (so it is kept, not escaped)."""

    def __init__(self, keep: str = LOG_KEEPS) -> None:
        self.keep, self._held = keep, ""

    def feed(self, text: str) -> str:
        text, self._held = self._held + text, ""
        cut = _PARTIAL_SGR.search(text)
        if cut:
            text, self._held = text[:cut.start()], text[cut.start():]
        return terminal_safe(text, self.keep)

    def end(self) -> str:
        """What was held back (an unfinished sequence at the log's end), escaped."""
        held, self._held = self._held, ""
        return terminal_safe(held, self.keep)


def escaped(data: typing.Any) -> typing.Any:
    """``data`` (as decoded from JSON, or typed: dataclasses such as the ``messages`` views,
    errors) with every string in it, keys too, ``escape``d; enum members stay as they are.
    What holds nothing to escape is returned as it is (the monitor escapes 3,000 jobs a
    refresh, nearly all of them clean)."""
    if isinstance(data, str):
        return data if isinstance(data, enum.Enum) else escape(data)
    if data is None or isinstance(data, (int, float)):
        return data
    names = _init_fields(type(data))
    if names is not None:
        changed = {}
        for name in names:
            value = getattr(data, name)
            new = escaped(value)
            if new is not value:
                changed[name] = new
        return dataclasses.replace(data, **changed) if changed else data
    if isinstance(data, IadeepError):
        return error_from_dict(escaped(data.to_dict()))
    if isinstance(data, dict):
        items = [(escaped(k), escaped(v)) for k, v in data.items()]
        same = all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, data.items()))
        return data if same else dict(items)
    if isinstance(data, (list, tuple)):
        values = [escaped(v) for v in data]
        return data if all(a is b for a, b in zip(values, data)) else type(data)(values)
    return data


_INIT_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _init_fields(cls: type) -> tuple[str, ...] | None:
    """The fields a dataclass ``cls`` is built from; None if it is not a dataclass."""
    if cls not in _INIT_FIELDS:
        _INIT_FIELDS[cls] = (tuple(f.name for f in dataclasses.fields(cls) if f.init)
                             if dataclasses.is_dataclass(cls) else None)
    return _INIT_FIELDS[cls]


def typed(label: str, value: object, hint: object) -> typing.Any:
    """``value`` converted to ``hint`` (an annotation: bool, int, float, str, dict, list[X],
    tuple[X, ...], tuple[X, Y], X | None, Any), or an InputError. JSON has lists where Python
    has tuples and ints where it has floats; ``true`` is never an integer, and numbers must
    be finite and fit SQLite."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        [inner] = [a for a in args if a is not type(None)]
        return typed(label, value, inner)
    if origin in (list, tuple):
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            _wrong(label, value, f"a list of at most {MAX_ITEMS} items")
        if origin is tuple and args[-1] is not Ellipsis:
            if len(value) != len(args):
                _wrong(label, value, f"a list of {len(args)} items")
            items = [typed(f"{label}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args))]
        else:
            items = [typed(f"{label}[{i}]", v, args[0]) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and -INT64 - 1 <= value <= INT64
    elif hint is float:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and abs(value) <= INT64)   # False for NaN and infinities too
        value = float(value) if ok else value  # type: ignore[arg-type]  # ok: a number
    elif hint is str:
        ok = isinstance(value, str)
    elif hint is dict or origin is dict:
        ok = isinstance(value, dict)
    else:
        raise TypeError(f"typed() does not know the annotation {hint!r}")  # a bug, not input
    if not ok:
        _wrong(label, value, _DESCRIBE[origin or hint])
    return value


_DESCRIBE: dict[object, str] = {bool: "true or false", int: "an integer", float: "a finite number",
             str: "a string", dict: "an object"}


def _wrong(label: str, value: object, want: str) -> typing.NoReturn:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        got = repr(value)[:24]   # the number itself: NaN, inf, too large, or not an integer
    else:
        got = {bool: "a boolean", str: "a string", list: "a list", dict: "an object",
               type(None): "null"}.get(type(value), type(value).__name__)
    raise InputError(f"malformed request: {label} must be {want}, got {got}",
                     hint=_MALFORMED_HINT)

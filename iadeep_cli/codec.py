"""The JSON form of the controller's protocol (``messages``): ``Message``, the base of every
request and view (its fields' JSON keys, in their order), and ``encode``/``decode`` for values
of any annotation (messages, errors, enums, tuples, lists and dicts of them). Converters are
worked out once per class and per annotation: the monitor converts thousands of jobs a
refresh.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import operator
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, TypeVar

from .errors import IadeepError, error_from_dict
from .jobs import SubmitSpec


def wire(key: str) -> dict[str, str]:
    """Metadata of a field that travels under another JSON ``key``."""
    return {"key": key}


def optional() -> Any:
    """A field (default None) whose key the JSON has only while it is set."""
    return field(default=None, metadata={"optional": True})


class Message:
    """Base of every message: JSON by its dataclass fields, in their order."""

    @classmethod
    def key(cls, name: str) -> str:
        """The JSON key of field ``name``."""
        return _fields(cls)[name].metadata.get("key", name)

    def to_dict(self) -> dict[str, Any]:
        values, plan = _encoders(type(self))
        return {key: convert(value) for (key, omit_none, convert), value in zip(plan, values(self))
                if not (omit_none and value is None)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        return cls(**{name: convert(data[key]) for name, key, convert in _decoders(cls)
                      if key in data})


T = TypeVar("T")


def _per_class(compute: Callable[[type], T]) -> Callable[[type], T]:
    """``compute(cls)``, worked out once per class (the monitor converts thousands of jobs a
    refresh)."""
    done: dict[type, T] = {}

    def cached(cls: type) -> T:
        if cls not in done:
            done[cls] = compute(cls)
        return done[cls]
    return cached


@_per_class
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


@_per_class
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@_per_class
def _encoders(cls: type) -> tuple[Callable[[Any], tuple], tuple[tuple[str, bool, Any], ...]]:
    """A getter of all fields of message class ``cls`` at once, and for each field: its JSON
    key, whether it is left out while None, its converter."""
    hints, fields = _hints(cls), _fields(cls)
    getter = operator.attrgetter(*fields) if len(fields) > 1 else (
        lambda obj: tuple(getattr(obj, name) for name in fields))
    return getter, tuple((f.metadata.get("key", name), bool(f.metadata.get("optional")),
                          _encoder(hints[name])) for name, f in fields.items())


@_per_class
def _decoders(cls: type) -> tuple[tuple[str, str, Callable[[Any], Any]], ...]:
    """(field, JSON key, converter) of each field of message class ``cls``."""
    hints = _hints(cls)
    return tuple((name, f.metadata.get("key", name), _decoder(hints[name]))
                 for name, f in _fields(cls).items())


_PLAIN = frozenset({str, int, float, bool, type(None)})   # exactly these: JSON as they are


def _as_is(data: Any) -> Any:
    return data


def encode(value: Any) -> Any:
    """``value`` (a message, an error, or lists and dicts of them) as JSON-able data."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, (Message, SubmitSpec)):   # SubmitSpec: a payload with its own form
        return value.to_dict()
    if isinstance(value, IadeepError):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {encode(k): encode(v) for k, v in value.items()}
    return value


@functools.cache
def _encoder(hint: Any) -> Callable[[Any], Any]:
    """``encode`` for values of annotation ``hint``, worked out once per annotation."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        [inner] = [a for a in args if a is not type(None)]
        convert = _encoder(inner)
        return _as_is if convert is _as_is else lambda v: None if v is None else convert(v)
    if origin in (list, tuple):
        item = _encoder(args[0])
        return list if item is _as_is else lambda v: [item(x) for x in v]
    if hint in (str, int, float, bool):
        return _as_is
    return encode


def decode(hint: Any, data: Any) -> Any:
    """JSON ``data`` (from the controller) as the annotation ``hint`` says: messages, errors,
    enums, tuples; everything else as it is."""
    return _decoder(hint)(data)


@functools.cache
def _decoder(hint: Any) -> Callable[[Any], Any]:
    """The converter for values of annotation ``hint``, worked out once per annotation."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        [inner] = [a for a in args if a is not type(None)]
        convert = _decoder(inner)
        return _as_is if convert is _as_is else lambda d: None if d is None else convert(d)
    if origin in (list, tuple):
        make, item = (tuple if origin is tuple else list), _decoder(args[0])
        return make if item is _as_is else lambda d: make(item(v) for v in d)
    if origin is dict:
        key, value = _decoder(args[0]), _decoder(args[1])
        return lambda d: {key(k): value(v) for k, v in d.items()}
    if isinstance(hint, type) and issubclass(hint, (Message, SubmitSpec)):
        return hint.from_dict
    if hint is IadeepError:
        return error_from_dict
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    return _as_is

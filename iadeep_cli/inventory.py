"""The lab's node inventory (``nodes.yaml``): YAML in, validated immutable objects out.

Validation is strict because a typo in a scheduler's config silently changes placement: unknown
keys, wrong types and duplicate names are refused, and every message names the file, the line and
the field, e.g. ``nodes.yaml:12: nodes[1].port: expected an integer, got 'twenty-two'``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .errors import ConfigError
from .paths import inventory_path


@dataclass(frozen=True)
class Node:
    """One GPU server. ``local`` marks the controller's own machine (polled through NVML)."""

    name: str
    host: str
    port: int | None = None          # None: take it from ~/.ssh/config, else 22
    user: str | None = None          # None: from ~/.ssh/config, else the controller's user
    identity_file: str | None = None
    gpus: tuple[int, ...] | None = None   # None: every GPU the node reports
    max_jobs_per_gpu: int | None = None   # None: the lab default
    labels: tuple[str, ...] = ()
    local: bool = False
    workdir: str = "~/.iadeep"       # where job directories are created on the node


@dataclass(frozen=True)
class Policy:
    """Placement settings; see README 'How placement decides'."""

    share_threshold: float = 1.1     # predicted combined speed needed before two jobs share
    min_speed: float = 0.5           # default floor for any job's predicted speed when sharing
    max_jobs_per_gpu: int = 2
    memory_margin_gib: float = 2.0   # added to a profile's peak memory (CUDA context, cache)
    aging_per_hour: float = 1.0      # priority points a waiting job gains per hour
    reserve_after_s: float = 3600.0  # a blocked whole-GPU job then reserves GPUs (no starvation)


@dataclass(frozen=True)
class UserLimit:
    max_gpus: int | None = None
    max_jobs: int | None = None


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    admins: tuple[str, ...] = ()
    poll_interval_s: float = 10.0
    node_grace_s: float = 60.0       # silence after which a node is marked down, its jobs lost
    policy: Policy = field(default_factory=Policy)
    user_limits: dict[str, UserLimit] = field(default_factory=dict)
    default_retries: int = 0
    job_dir_retention_s: float = 7 * 86400   # finished jobs' directories on nodes kept this long
    path: Path | None = None

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    def is_admin(self, user: str) -> bool:
        return user in self.admins or user == "root"


EMPTY = Inventory(nodes=())


# --------------------------------------------------------------------------- validation helpers
class _Ctx:
    """Carries the file name so every message can say file:line: field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, node: yaml.Node | None, where: str, msg: str) -> ConfigError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return ConfigError(
            f"{self.path}{line}: {where}: {msg}",
            hint="fix the inventory (see nodes.yaml.example for every field)",
        )


def _scalar(ctx: _Ctx, node: yaml.Node, where: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, where, "expected a single value, got a list or mapping")
    try:  # resolve the tag the way safe_load would (`!!int abc` and `!foo 1` fail here)
        return yaml.SafeLoader("").construct_object(node)
    except (yaml.YAMLError, ValueError) as exc:
        raise ctx.fail(node, where, f"cannot read value {node.value!r}: "
                                    f"{getattr(exc, 'problem', None) or exc}") from None


def _typed(kind: type | tuple, label: str) -> Callable[[_Ctx, yaml.Node, str], Any]:
    def conv(ctx: _Ctx, node: yaml.Node, where: str) -> Any:
        value = _scalar(ctx, node, where)
        ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in _as_tuple(kind))
        if not ok:
            raise ctx.fail(node, where, f"expected {label}, got {value!r}")
        return float(value) if kind == (int, float) else value
    return conv


def _as_tuple(kind: type | tuple) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


_str = _typed(str, "a string")
_int = _typed(int, "an integer")
_num = _typed((int, float), "a number")
_bool = _typed(bool, "true or false")


def _positive(conv, label="a positive number"):
    def check(ctx, node, where):
        value = conv(ctx, node, where)
        if value is not None and value < 0:
            raise ctx.fail(node, where, f"expected {label}, got {value!r}")
        return value
    return check


def _str_list(ctx: _Ctx, node: yaml.Node, where: str) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, where, "expected a list of strings")
    return tuple(_str(ctx, item, f"{where}[{i}]") for i, item in enumerate(node.value))


def _int_list(ctx: _Ctx, node: yaml.Node, where: str) -> tuple[int, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, where, "expected a list of GPU indices, e.g. [0, 1]")
    return tuple(_positive(_int, "a GPU index >= 0")(ctx, item, f"{where}[{i}]")
                 for i, item in enumerate(node.value))


def _mapping(ctx: _Ctx, node: yaml.Node, where: str, fields: dict) -> dict[str, Any]:
    """Convert a YAML mapping whose allowed keys and converters are given by ``fields``."""
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, where, "expected a mapping of key: value")
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = _scalar(ctx, key_node, where)
        sub = f"{where}.{key}" if where else str(key)
        if key not in fields:
            allowed = ", ".join(sorted(fields))
            raise ctx.fail(key_node, sub, f"unknown key {key!r} (allowed: {allowed})")
        if key in out:
            raise ctx.fail(key_node, sub, "given twice")
        out[key] = fields[key](ctx, value_node, sub)
    return out


# --------------------------------------------------------------------------- schema
_NODE_FIELDS = {
    "name": _str, "host": _str, "port": _positive(_int, "a port number"), "user": _str,
    "identity_file": _str, "gpus": _int_list, "labels": _str_list, "local": _bool,
    "max_jobs_per_gpu": _positive(_int, "a whole number >= 1"), "workdir": _str,
}
_POLICY_FIELDS = {
    "share_threshold": _positive(_num), "min_speed": _positive(_num),
    "max_jobs_per_gpu": _positive(_int, "a whole number >= 1"),
    "memory_margin_gib": _positive(_num), "aging_per_hour": _positive(_num),
    "reserve_after_s": _positive(_num),
}
_LIMIT_FIELDS = {"max_gpus": _positive(_int), "max_jobs": _positive(_int)}


def _user_limits(ctx: _Ctx, node: yaml.Node, where: str) -> dict[str, UserLimit]:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, where, "expected a mapping of user: {max_gpus: N, max_jobs: N}")
    out = {}
    for key_node, value_node in node.value:
        user = _str(ctx, key_node, where)
        out[user] = UserLimit(**_mapping(ctx, value_node, f"{where}.{user}", _LIMIT_FIELDS))
    return out


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(ctx: _Ctx, node: yaml.Node, where: str) -> float:
    """Seconds, given as a number or as ``90s``, ``30m``, ``12h``, ``7d``."""
    value = _scalar(ctx, node, where)
    text = str(value).strip()
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        seconds = -1.0
    if isinstance(value, bool) or not 0 <= seconds < float("inf"):
        raise ctx.fail(node, where, f"expected a duration such as 7d, 12h, 30m or 3600, "
                                    f"got {value!r}")
    return seconds


_LAB_FIELDS = {
    "admins": _str_list, "poll_interval": _positive(_num), "node_grace": _positive(_num),
    "default_retries": _positive(_int),
    "policy": lambda ctx, n, w: Policy(**_mapping(ctx, n, w, _POLICY_FIELDS)),
    "user_limits": _user_limits, "job_dir_retention": _duration,
}


def _nodes(ctx: _Ctx, node: yaml.Node, where: str) -> tuple[Node, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, where, "expected a list of nodes (each starting with '- name: ...')")
    result: list[Node] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(node.value):
        sub = f"nodes[{i}]"
        values = _mapping(ctx, item, sub, _NODE_FIELDS)
        for required in ("name", "host"):
            if required not in values and not (required == "host" and values.get("local")):
                raise ctx.fail(item, f"{sub}.{required}", "missing (every node needs it)")
        values.setdefault("host", "localhost")
        name = values["name"]
        if name in seen:
            raise ctx.fail(item, f"{sub}.name", f"duplicate node name {name!r} "
                                                f"(also nodes[{seen[name]}])")
        seen[name] = i
        if values.get("max_jobs_per_gpu") == 0:
            raise ctx.fail(item, f"{sub}.max_jobs_per_gpu", "must be at least 1")
        result.append(Node(**values))
    return tuple(result)


_TOP_FIELDS = {"lab": lambda ctx, n, w: _mapping(ctx, n, w, _LAB_FIELDS), "nodes": _nodes}


def parse_inventory(text: str, path: Path) -> Inventory:
    """Validate YAML text (``path`` is only used in messages)."""
    ctx = _Ctx(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{line}: not valid YAML: {problem}",
                          hint="check indentation and quoting near that line") from None
    if root is None:
        return Inventory(nodes=(), path=path)
    top = _mapping(ctx, root, "", _TOP_FIELDS)
    lab = top.get("lab", {})
    return Inventory(
        nodes=top.get("nodes", ()),
        admins=lab.get("admins", ()),
        poll_interval_s=lab.get("poll_interval", 10.0),
        node_grace_s=lab.get("node_grace", 60.0),
        policy=lab.get("policy", Policy()),
        user_limits=lab.get("user_limits", {}),
        default_retries=lab.get("default_retries", 0),
        job_dir_retention_s=lab.get("job_dir_retention", 7 * 86400),
        path=path,
    )


def load_inventory(explicit: str | Path | None = None, *, missing_ok: bool = False) -> Inventory:
    """Load and validate the inventory from ``--inventory``, ``$IADEEP_INVENTORY`` or the state dir.

    ``missing_ok`` lets the controller start on an empty cluster when no file was named at all.
    """
    path = inventory_path(explicit)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok and explicit is None:
            return Inventory(nodes=(), path=None)
        raise ConfigError(f"{path}: inventory file not found",
                          hint="pass --inventory FILE, set IADEEP_INVENTORY, "
                               "or copy nodes.yaml.example there") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read inventory: {getattr(exc, 'strerror', None) or exc}",
                          hint="check the file's permissions and encoding (UTF-8)") from None
    return parse_inventory(text, path)

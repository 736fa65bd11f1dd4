"""The oldest versions iadeep says it works with, as pins: ``name==lower-bound`` for every
dependency in pyproject.toml (and the ``plot`` extra), one a line.

``make check-min-deps`` installs exactly these into a fresh virtualenv and runs the in-process
tests there, so each ``>=`` in pyproject.toml is a version that was tested, not a guess. A
dependency without a ``>=`` bound is an error here (and in tests/unit/test_dependencies.py).

    .venv/bin/python tests/min_deps.py

It reads the requirements from the installed iadeep's metadata (made from pyproject.toml when
`make` installed it), so it needs no TOML parser on Python 3.10.
"""
from __future__ import annotations

import re
import sys
from importlib import metadata

# the extras whose lower bounds are tested with the core's (the test tools are not iadeep's)
TESTED_EXTRAS = ("plot",)
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$")


def requirements(extras: tuple[str, ...] = TESTED_EXTRAS) -> list[str]:
    """iadeep's requirements, and those of ``extras``, without their environment markers."""
    out = []
    for req in metadata.requires("iadeep") or []:
        spec, _, marker = req.partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if extra is None or extra.group(1) in extras:
            out.append(spec.strip())
    return out


def lower_bound(requirement: str) -> tuple[str, str]:
    """("numpy", "1.23.2") from "numpy>=1.23.2"; ValueError when there is no ``>=``."""
    m = _REQ.match(requirement.split(";")[0])
    if m is None:
        raise ValueError(f"cannot read the requirement {requirement!r}")
    name, specs = m.groups()
    lows = [s.strip()[2:].strip() for s in specs.split(",") if s.strip().startswith(">=")]
    if len(lows) != 1:
        raise ValueError(f"{requirement!r} has no single '>=' lower bound")
    return name, lows[0]


def main() -> None:
    try:
        pins = [lower_bound(r) for r in requirements()]
    except ValueError as exc:
        sys.exit(f"Error: {exc} (hint: give every dependency in pyproject.toml a tested '>=' "
                 f"bound)")
    print("\n".join(f"{name}=={version}" for name, version in pins))


if __name__ == "__main__":
    main()

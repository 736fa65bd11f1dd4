"""pyproject.toml declares what iadeep_cli imports, and only that, each with a lower bound
(which `make check-min-deps` installs and tests: tests/min_deps.py)."""
import ast
import functools
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from min_deps import lower_bound

tomllib = pytest.importorskip("tomllib")   # Python 3.11+; the package itself needs 3.10+

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# Declared though no module of iadeep_cli imports it (each needs a reason written here): none.
DECLARED_NOT_IMPORTED: set[str] = set()
# The job's own framework, imported only by the hook a training job chooses
# (iadeep_cli/integrations/<framework>.py, on a node, in the job's environment): iadeep never
# imports them and declares none (the job brings its framework; `make frameworks` installs the
# CPU builds for the tests).
FRAMEWORKS = {"torch", "lightning", "transformers", "keras"}
INTEGRATIONS = "iadeep_cli/integrations/"
# Extras for working on iadeep, not for running it: the test tools and the docs site's builder.
DEV_EXTRAS = ("test", "docs")


@functools.cache
def _packages() -> dict[str, list[str]]:
    return packages_distributions()


def _name(requirement: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert m, requirement
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def _imported_modules() -> dict[str, str]:
    """Top-level modules outside the standard library that iadeep_cli imports, each with one
    file that imports it (lazy imports inside functions included)."""
    found: dict[str, str] = {}
    for path in sorted((REPO / "iadeep_cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in FRAMEWORKS and str(path.relative_to(REPO)).startswith(INTEGRATIONS):
                    continue
                if top not in sys.stdlib_module_names and top not in ("iadeep_cli", "__future__"):
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


@functools.cache
def _distribution(module: str) -> str:
    dists = _packages().get(module)
    assert dists, f"{module}: imported by iadeep_cli but not installed in this environment"
    return _name(dists[0])


def test_every_import_is_declared():
    runtime = {_name(r) for r in PROJECT["dependencies"]}
    optional = {_name(r) for extra, reqs in PROJECT["optional-dependencies"].items()
                if extra not in DEV_EXTRAS for r in reqs}
    undeclared = {f"{_distribution(m)} (import {m} in {where})"
                  for m, where in _imported_modules().items()
                  if _distribution(m) not in runtime | optional}
    assert undeclared == set()


def test_only_what_is_imported_is_declared():
    imported = {_distribution(m) for m in _imported_modules()}
    runtime = {_name(r) for r in PROJECT["dependencies"]}
    assert runtime - imported <= DECLARED_NOT_IMPORTED


@pytest.mark.parametrize("requirement", PROJECT["dependencies"]
                         + PROJECT["optional-dependencies"]["plot"])
def test_every_dependency_has_a_lower_bound(requirement):
    name, version = lower_bound(requirement)
    assert _name(name) == _name(requirement) and re.fullmatch(r"\d+(\.\d+)*", version)


@pytest.mark.parametrize("requirement", [r for extra in DEV_EXTRAS
                                         for r in PROJECT["optional-dependencies"][extra]])
def test_every_dev_tool_has_a_lower_bound(requirement):
    name, version = lower_bound(requirement)
    assert _name(name) == _name(requirement) and re.fullmatch(r"\d+(\.\d+)*", version)

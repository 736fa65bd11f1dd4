"""Every import in the package points down the layers, and no modules import each other in a
circle. The rule is read from the source (``ast``), lazy imports inside functions included: a
function-level import is how a cycle or an upward dependency usually sneaks in.

The layers (docs/architecture.md explains each one and where new code goes):

    layer  units                                   may import
    0      vocabulary: errors, paths, checks,      each other (no cycles)
           text, progress, snapshot, jobs,
           settings, inventory, profiles, jobopts,
           codec, messages, integrations
    1      store, model, nodes                     layer 0 (never each other)
    2      scheduler                               layers 0-1
    3      controller, sim                         layers 0-2 (never each other)
    4      tui                                     layers 0-3
    5      web                                     layers 0-4 (the page draws the tui's view)
    6      cli (and ``python -m iadeep_cli``)      layers 0-5 (`iadeep monitor` starts the tui,
                                                   `iadeep web` the web server)

A unit is a top-level module or subpackage of ``iadeep_cli``; inside a unit any import is
allowed as long as it makes no cycle. Jobs on nodes are controlled through the ``Backend`` seam
(``nodes/backend.py``, docs/backends.md): no module outside ``nodes`` imports a backend's
implementation (``nodes.shell``, ``nodes.slurm``); the pool hands each node's backend out.
UI libraries stay in their layer: typer in cli, textual and rich in tui (core modules are used
as a library and by the fast commands).

The controller has two rooms: ``controller.round`` (the scheduling round: the loop and its
steps) and ``controller.requests`` (what it answers: the socket, the service, the reads). Neither
imports the other: the service reaches the round only through the port it is given
(``requests/port.py``, which the runtime fills in). The modules beside them (``fairshare``,
``reservations``, ``catalog``, ``notify``, ...) are shared by both and import neither room; only
``runtime`` (which builds both) and ``client`` (which reads offline when the controller is down)
may.
"""
from __future__ import annotations

import ast
import functools
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "iadeep_cli"
VOCABULARY = ("__init__", "errors", "paths", "checks", "text", "progress", "snapshot", "jobs",
              "settings", "inventory", "profiles", "jobopts", "codec", "messages", "integrations")
LAYERS: dict[str, int] = {
    **dict.fromkeys(VOCABULARY, 0),
    "store": 1, "model": 1, "nodes": 1,
    "scheduler": 2,
    "controller": 3, "sim": 3,
    "tui": 4,
    "web": 5,
    "cli": 6,
}
NAMES = {0: "vocabulary", 1: "store/model/nodes", 2: "scheduler", 3: "controller/sim", 4: "tui",
         5: "web", 6: "cli"}
UI_LIBRARIES = {"typer": {"cli"}, "textual": {"tui"}, "rich": {"tui"}}
# The backends' implementations: only ``nodes`` itself (its pools) may import them.
BACKEND_IMPLEMENTATIONS = ("iadeep_cli.nodes.shell", "iadeep_cli.nodes.slurm")
# The controller's rooms, and the shared modules that may reach into them.
ROOMS = ("iadeep_cli.controller.round", "iadeep_cli.controller.requests")
ROOM_BUILDERS = ("iadeep_cli.controller.runtime", "iadeep_cli.controller.client")
HINT = ("move what both need down a layer (shared values to the vocabulary, formatting to "
        "iadeep_cli/text.py), or pass it in from above")


@dataclass(frozen=True)
class Import:
    source: str   # dotted module that imports
    target: str   # dotted module imported (a submodule when ``from pkg import submodule``)
    names: tuple[str, ...]   # names taken from target by ``from target import ...``
    where: str    # file:line

    def __str__(self) -> str:
        return f"{self.where}: {self.source} imports {self.target}"


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py file of the package at ``root``."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@functools.cache
def read_imports(root: Path) -> tuple[dict[str, Path], list[Import], list[Import]]:
    """(modules, imports within the package, imports of other packages) anywhere in a file."""
    modules = _modules(root)
    inner: list[Import] = []
    outer: list[Import] = []
    for module, path in modules.items():
        tree = _parse(path)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            where = f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found = Import(module, alias.name, (), where)
                    (inner if alias.name.split(".")[0] == root.name else outer).append(found)
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, is_package, node)
                if target.split(".")[0] != root.name:
                    outer.append(Import(module, target, (), where))
                    continue
                plain = [a.name for a in node.names if f"{target}.{a.name}" not in modules]
                if plain:
                    inner.append(Import(module, target, tuple(plain), where))
                for alias in node.names:   # `from pkg import submodule` depends on the submodule
                    if f"{target}.{alias.name}" in modules:
                        inner.append(Import(module, f"{target}.{alias.name}", (), where))
    return modules, inner, outer


def unit(module: str) -> str:
    """``iadeep_cli.store.jobrows`` -> ``store``; ``python -m iadeep_cli`` is the cli's."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    return "cli" if name == "__main__" else name


def layer_problems(imports: list[Import]) -> list[str]:
    """One line per import that points up, or sideways between two units of one layer."""
    out = []
    for imp in imports:
        src, dst = unit(imp.source), unit(imp.target)
        if src == dst or (LAYERS[src] == LAYERS[dst] == 0) or LAYERS[dst] < LAYERS[src]:
            continue
        way = "up" if LAYERS[dst] > LAYERS[src] else "sideways"
        out.append(f"{imp} ({way}: {src}, layer {LAYERS[src]} {NAMES[LAYERS[src]]}, may not "
                   f"import {dst}, layer {LAYERS[dst]} {NAMES[LAYERS[dst]]}); {HINT}")
    return out


def backend_reach_ins(imports: list[Import]) -> list[str]:
    """One line per import of a backend's implementation from outside ``nodes``."""
    return [f"{imp}, a backend's implementation: use the node's ``Backend`` from its pool "
            "(``pool.backend(node)``, nodes/backend.py) or add what is missing to that seam"
            for imp in imports if unit(imp.source) != "nodes" and any(
                imp.target == b or imp.target.startswith(b + ".") for b in BACKEND_IMPLEMENTATIONS)]


def room(module: str) -> str | None:
    """The controller room ``module`` is in (``iadeep_cli.controller.round``...); None outside."""
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


def room_problems(imports: list[Import]) -> list[str]:
    """One line per import from one controller room into the other, or into either room from a
    shared controller module other than the runtime and the client."""
    out = []
    for imp in imports:
        src, dst = room(imp.source), room(imp.target)
        if dst is None or src == dst or unit(imp.source) != "controller":
            continue
        if src is None and imp.source in ROOM_BUILDERS:
            continue
        out.append(f"{imp} (the controller's {src or 'shared modules'} may not import "
                   f"{dst}): pass it in through a port (controller/requests/port.py) or move "
                   "what both need beside the rooms (controller/*.py)")
    return out


def cycles(imports: list[Import]) -> list[tuple[list[str], list[Import]]]:
    """Each group of modules that import each other in a circle (Tarjan's strongly connected
    components), with one shortest loop through it as the chain of imports that closes it."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if imp.source != imp.target:
            edges.setdefault(imp.source, {}).setdefault(imp.target, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    out = []
    for group in groups:   # breadth first from one module back to itself: a shortest loop
        start = min(group)
        came_by: dict[str, Import] = {}
        frontier, closing = [start], None
        while closing is None:
            nxt = []
            for v in frontier:
                for w, imp in sorted(edges[v].items()):
                    if w == start:
                        closing = closing or imp
                    elif w in group and w not in came_by:
                        came_by[w] = imp
                        nxt.append(w)
            frontier = nxt
        chain = [closing]
        while chain[0].source != start:
            chain.insert(0, came_by[chain[0].source])
        out.append((sorted(group), chain))
    return out


def missing_targets(modules: dict[str, Path], imports: list[Import]) -> list[str]:
    """Imports of a module, or of a name, that the package does not have: a lazy import inside
    a function fails only when that function runs, so it is checked here."""
    bound: dict[str, set[str]] = {}
    for module, path in modules.items():
        names = bound.setdefault(module, set())
        body = list(_parse(path).body)
        for node in body:
            if isinstance(node, ast.If):      # `if TYPE_CHECKING: ... else: ...` binds names too
                body += node.body + node.orelse
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    out = []
    for imp in imports:
        if imp.target not in modules:
            out.append(f"{imp}, which does not exist")
        else:
            out += [f"{imp.where}: {imp.source} imports {name!r} from {imp.target}, which does "
                    "not define it" for name in imp.names if name not in bound[imp.target]]
    return out


# --------------------------------------------------------------------------------- the rules
def test_every_unit_has_a_layer():
    modules, _, _ = read_imports(PACKAGE)
    unknown = sorted({unit(m) for m in modules} - set(LAYERS))
    assert not unknown, (f"no layer for {unknown}: add each to LAYERS in "
                         "tests/unit/test_layers.py and to the table in docs/architecture.md")


def test_imports_point_down_the_layers():
    _, inner, _ = read_imports(PACKAGE)
    problems = layer_problems(inner)
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_the_controllers_rooms_import_each_other_only_through_a_port():
    _, inner, _ = read_imports(PACKAGE)
    problems = room_problems(inner)
    assert not problems, "\n".join(problems)


def test_only_nodes_imports_a_backend_implementation():
    _, inner, _ = read_imports(PACKAGE)
    problems = backend_reach_ins(inner)
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    _, inner, _ = read_imports(PACKAGE)
    found = cycles(inner)
    assert not found, "import cycles (lazy imports count: they only hide the cycle):\n" + \
        "\n".join(" -> ".join(str(i) for i in chain) + f" (one loop among {', '.join(group)})"
                  for group, chain in found)


def test_every_import_names_something_that_exists():
    modules, inner, _ = read_imports(PACKAGE)
    problems = missing_targets(modules, inner)
    assert not problems, "\n".join(problems)


def test_ui_libraries_stay_in_their_layer():
    _, _, outer = read_imports(PACKAGE)
    problems = [f"{imp}: only {sorted(UI_LIBRARIES[lib])} may import {lib}"
                for imp in outer for lib in [imp.target.split(".")[0]]
                if lib in UI_LIBRARIES and unit(imp.source) not in UI_LIBRARIES[lib]]
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------- the checker can fail
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "iadeep_cli"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_the_checker_names_an_upward_lazy_import_and_a_cycle(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "errors.py": "",
        "store/__init__.py": "from ..errors import Oops\n",
        "store/jobs.py": "def f():\n    from ..controller import loop\n",
        "controller/__init__.py": "",
        "controller/loop.py": "from ..store import jobs\n",
        "cli/__init__.py": "",
        "cli/main.py": "from . import groups\n",
        "cli/groups.py": "from .main import app\n",
    })
    modules, inner, _ = read_imports(root)
    assert layer_problems(inner) == [
        "iadeep_cli/store/jobs.py:2: iadeep_cli.store.jobs imports iadeep_cli.controller.loop "
        "(up: store, layer 1 store/model/nodes, may not import controller, layer 3 "
        f"controller/sim); {HINT}"]
    chains = {" -> ".join(i.source for i in chain) for _, chain in cycles(inner)}
    assert chains == {"iadeep_cli.cli.groups -> iadeep_cli.cli.main",
                      "iadeep_cli.controller.loop -> iadeep_cli.store.jobs"}
    assert missing_targets(modules, inner) == [
        "iadeep_cli/cli/groups.py:1: iadeep_cli.cli.groups imports 'app' from "
        "iadeep_cli.cli.main, which does not define it",
        "iadeep_cli/store/__init__.py:1: iadeep_cli.store imports 'Oops' from iadeep_cli.errors,"
        " which does not define it"]


@pytest.mark.parametrize("source, target", [("tui", "cli"), ("store", "model"),
                                            ("model", "store"), ("sim", "controller")])
def test_the_checker_refuses_the_imports_that_were_removed(source, target):
    """The offenders issue 11 found: tui -> cli.render, store.profiles <-> model, and siblings."""
    imp = Import(f"iadeep_cli.{source}.a", f"iadeep_cli.{target}.b", (), "x.py:1")
    assert len(layer_problems([imp])) == 1


@pytest.mark.parametrize("target", ["iadeep_cli.nodes.slurm", "iadeep_cli.nodes.slurm.pool",
                                    "iadeep_cli.nodes.shell.backend"])
def test_the_checker_refuses_a_backend_implementation_outside_nodes(target):
    """The controller once imported ``nodes.slurm`` (held_in_slurm, SlurmPool) and the shell
    code (``nodes.launcher``) directly; a pool of nodes may, a controller may not."""
    assert len(backend_reach_ins([Import("iadeep_cli.controller.loop", target, (), "x:1")])) == 1
    assert backend_reach_ins([Import("iadeep_cli.nodes.pools", target, (), "x:1"),
                              Import("iadeep_cli.controller.loop", "iadeep_cli.nodes.backend",
                                     (), "x:1")]) == []


@pytest.mark.parametrize("source, target, refused", [
    ("controller.requests.service", "controller.round.loop", True),
    ("controller.round.steps.idle", "controller.requests.views", True),
    ("controller.notify", "controller.round.steps.idle", True),
    ("controller.runtime", "controller.round.loop", False),
    ("controller.round.steps.schedule", "controller.reservations", False),
    ("controller.requests.views", "controller.requests.offline", False)])
def test_the_checker_keeps_the_controllers_rooms_apart(source, target, refused):
    imp = Import(f"iadeep_cli.{source}", f"iadeep_cli.{target}", (), "x.py:1")
    assert len(room_problems([imp])) == int(refused)

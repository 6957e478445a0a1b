"""hpcrl's modules import one another without a cycle.

The graph comes from the syntax tree of every module of the package: an edge A -> B for each
import of B in A, wherever it sits. Imports inside functions count: a lazy import only moves the
cycle from import time to call time, and the two modules still need each other, so neither can be
read, tested or moved without the other. Imports under `if TYPE_CHECKING:` count for the same
reason. `from hpcrl.a import b` is an edge to the module hpcrl.a.b when there is one, else to
hpcrl.a (its __init__, where the name b lives). Importing hpcrl.a.b is no edge to the package
hpcrl.a: Python runs hpcrl/a/__init__.py first, but every package whose __init__ gathers its own
submodules would then be a cycle.
"""
from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "hpcrl"


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at `root`, by dotted name (a package by its __init__.py)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _module_of(name: str, known: dict) -> str | None:
    """The module an imported dotted name lies in: the name itself, or the nearest one above it."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(node: ast.AST, package: str) -> list[str]:
    """The dotted names an import statement brings in; `package`: the importing module's package,
    for relative imports."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # from . import x, from ..a import x
        parts = package.split(".")
        base = ".".join([*parts[:len(parts) - node.level + 1], *([node.module] if node.module else [])])
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """For each module of the package at `root`: the package's modules it imports, each with the
    line of its first import there."""
    known = modules(root)
    graph = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for imported in _imported_names(node, package):
                if imported.split(".")[0] != root.name:
                    continue
                module = _module_of(imported, known)
                if module is not None and module != name:
                    edges[module] = min(edges.get(module, node.lineno), node.lineno)
        graph[name] = edges
    return graph


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's groups of modules that all reach one another."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle through each group of modules that import one another, as a path of
    modules that ends where it starts."""
    return [_shortest_cycle(graph, set(group), min(group)) for group in _strongly_connected(graph) if len(group) > 1]


def _shortest_cycle(graph: dict[str, dict[str, int]], members: set[str], start: str) -> list[str]:
    """A breadth-first walk from `start` inside `members` (modules that all reach one another) back to it."""
    came_from: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if w in members and w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"{start} is in a group that reaches it, yet no path leads back to it")


def describe(cycle: list[str], graph: dict[str, dict[str, int]], root: Path) -> str:
    """`a (a.py:12) -> b (b.py:40) -> a`: each module, with the line where it imports the next."""
    files = modules(root)
    steps = [f"{a} ({files[a].relative_to(root.parent)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join([*steps, cycle[-1]])


def test_the_package_imports_without_a_cycle():
    graph = import_graph(PACKAGE)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(c, graph, PACKAGE) for c in found)


def test_the_graph_holds_lazy_imports():
    """EnvRank imports the inline policy's module (torch) inside a function, only where it runs."""
    assert "hpcrl.workers.policy_server" in import_graph(PACKAGE)["hpcrl.workers.env_rank"]


def test_a_cycle_through_a_lazy_or_relative_import_is_found_and_named(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {"__init__.py": "", "a.py": "import os\nfrom pkg.sub import b\n",
             "sub/__init__.py": "", "sub/b.py": "def f():\n    from ..a import g\n    return g\n",
             "c.py": "from pkg import a\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b": 2} and graph["pkg.sub.b"] == {"pkg.a": 2} and graph["pkg.c"] == {"pkg.a": 1}
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.sub.b", "pkg.a"]]
    assert describe(found[0], graph, pkg) == "pkg.a (pkg/a.py:2) -> pkg.sub.b (pkg/sub/b.py:2) -> pkg.a"

"""No import cycles between the modules of `nemo_rl_clone` (issue 36).

Every module is parsed with `ast`; its imports of `nemo_rl_clone.*` give the edges: module-level and function-local
ones alike (a function-local import only delays the cycle), but not those under ``if TYPE_CHECKING:``, which never
run. The strongly connected components of that graph are the cycles.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path

import nemo_rl_clone

PACKAGE_DIR = Path(nemo_rl_clone.__file__).parent


def find_modules(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> its file; a package is named by its directory and maps to its ``__init__.py``."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes_of(other)
            continue
        yield from _import_nodes_of(child)


def _import_nodes_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    yield from _import_nodes(node)


def imported_modules(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The project modules whose code runs when module ``name`` (at ``path``) is imported and its functions called."""
    root = name.split(".")[0]
    is_package = path.name == "__init__.py"
    named: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            package = name.split(".") if is_package else name.split(".")[:-1]
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        for alias in node.names:
            # `from pkg import sub` imports the submodule; `from pkg import obj` runs pkg's `__init__`.
            named.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    # Importing a.b.c also runs the `__init__` of a and a.b, except of the packages enclosing this module: Python
    # initialises those before it. That exception is what keeps a package `__init__` that imports its own submodules
    # (which import their siblings) from counting as a cycle with them.
    parts = name.split(".")
    enclosing = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    found: set[str] = set()
    for module in named:
        if module != root and not module.startswith(root + "."):
            continue
        pieces = module.split(".")
        found.update(".".join(pieces[:i]) for i in range(2, len(pieces) + 1))
    return {module for module in found - enclosing if module in modules}


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    modules = find_modules(package_dir)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted, in order of their first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def cycles(graph: Mapping[str, set[str]], component: list[str]) -> list[list[str]]:
    """For each import inside ``component``, the shortest cycle through it (duplicates dropped), as
    ``[a, b, ..., a]``: breaking every listed cycle breaks the component."""
    members = set(component)
    found: dict[tuple[str, ...], list[str]] = {}
    for source in component:
        for target in sorted(graph[source] & members):
            back = _shortest_path(graph, members, target, source)
            cycle = [source, *back]
            start = cycle.index(min(cycle[:-1]))
            key = tuple(cycle[start:-1] + cycle[:start])
            found.setdefault(key, [*key, key[0]])
    return [found[key] for key in sorted(found)]


def _shortest_path(graph: Mapping[str, set[str]], members: set[str], start: str, end: str) -> list[str]:
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == end:
            break
        for target in sorted(graph[node] & members):
            if target not in previous:
                previous[target] = node
                queue.append(target)
    path = [end]
    while (step := previous[path[-1]]) is not None:
        path.append(step)
    return path[::-1]


def _all_cycles() -> list[list[str]]:
    graph = import_graph(PACKAGE_DIR)
    return [cycle for component in strongly_connected(graph) for cycle in cycles(graph, component)]


def test_no_import_cycles() -> None:
    bad = [" -> ".join(cycle) for cycle in _all_cycles()]
    assert not bad, "import cycles (move the shared piece to the module that owns it):\n" + "\n".join(bad)


def test_graph_reads_imports_as_python_runs_them(tmp_path: Path) -> None:
    """The edge rules on a tiny package: function-local imports count, TYPE_CHECKING ones do not, ``from pkg import
    sub`` names the submodule, and an ``__init__`` importing its own submodules is no cycle."""
    files = {
        "__init__.py": "",
        "a.py": "def f():\n    from pkg import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\nfrom pkg.sub import x\n",
        "c.py": "from pkg import b\n",
        "sub/__init__.py": "from pkg.sub.x import X\nfrom .y import Y\n",
        "sub/x.py": "from pkg.sub import y\nX = 1\n",
        "sub/y.py": "from . import x\nfrom .. import a\nY = 2\n",
    }
    for relative, text in files.items():
        (tmp_path / "pkg" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / relative).write_text(text)
    graph = import_graph(tmp_path / "pkg")
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.sub", "pkg.sub.x"}
    assert graph["pkg.sub"] == {"pkg.sub.x", "pkg.sub.y"}
    assert graph["pkg.sub.y"] == {"pkg.sub.x", "pkg.a"}
    # a -> b -> sub.x -> sub.y -> a; the `__init__` of pkg.sub joins it only through b importing it.
    (component,) = strongly_connected(graph)
    assert component == ["pkg.a", "pkg.b", "pkg.sub", "pkg.sub.x", "pkg.sub.y"]
    assert ["pkg.a", "pkg.b", "pkg.sub.x", "pkg.sub.y", "pkg.a"] in cycles(graph, component)

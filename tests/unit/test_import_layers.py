"""Imports between the top-level folders of `nemo_rl_clone` point down only (issue 52).

Every module is parsed with `ast`. An import counts wherever it is written — module level, inside a function, under
``if TYPE_CHECKING:`` — and so does a string naming a module (``"nemo_rl_clone.x.y"`` or ``"nemo_rl_clone.x.y:attr"``,
the targets of registries and lazy exports), since each one couples the two folders as much as an import does. The
only exceptions are the tables of `nemo_rl_clone.facades`: a module that exists to present another path may
import any layer, a module that refuses an unbuilt NeMo-RL feature imports only the refusal helper, and nothing
inside the package imports either.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import NamedTuple

import nemo_rl_clone
from nemo_rl_clone.facades import FACADES, REFUSED

PACKAGE = "nemo_rl_clone"
PACKAGE_DIR = Path(nemo_rl_clone.__file__).parent

# Bottom → top: a folder may import the folders before it. The package `__init__` runs on every import, so it sits
# below them all. A lazy package face (`utils.lazy_exports`) names submodules of its own package: never another layer.
LAYERS = (
    "utils",
    "distributed",
    "data_plane",
    "contract",
    "data",
    "models",
    "environments",
    "rollout",
    "algorithms",
    "evals",
    "viewer",
)
ALLOWED: dict[str, frozenset[str]] = {layer: frozenset(LAYERS[:rank]) for rank, layer in enumerate(LAYERS)}
ALLOWED[PACKAGE] = frozenset()
FACADE_TABLE = f"{PACKAGE}.facades"  # names modules, imports none: not scanned
REFUSAL = f"{PACKAGE}.utils.unsupported_modules"  # the one import of a refused module

_MODULE_STRING = re.compile(rf"{PACKAGE}(\.\w+)+(:[\w.]+)?")


class Import(NamedTuple):
    path: Path
    line: int
    module: str  # the importing module
    target: str  # the imported module (or the package whose attribute is imported)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """Every ``nemo_rl_clone`` module that module ``name`` (at ``path``) names, with its line; ``from pkg import sub``
    names the submodule."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.fullmatch(node.value):
            targets = [node.value.split(":")[0]]
        else:
            continue
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                yield Import(path, node.lineno, name, target)


@cache
def package_imports() -> tuple[Import, ...]:
    """Every import of every module of the package, parsed once for all the tests here."""
    modules = package_modules()
    return tuple(found for name, path in modules.items() for found in imports_of(name, path, modules))


def layer(module: str) -> str:
    """The top-level folder (or top-level module) ``module`` belongs to; the package itself is `PACKAGE`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def arrows_up() -> list[str]:
    """One line per import from a folder to one it may not import (the facade modules excepted)."""
    found: dict[str, None] = {}  # ordered, one line per arrow
    for imported in package_imports():
        if imported.module in FACADES or imported.module in REFUSED or imported.module == FACADE_TABLE:
            continue
        source, target = layer(imported.module), layer(imported.target)
        if target != source and target not in ALLOWED.get(source, ()):
            where = f"{imported.path.relative_to(PACKAGE_DIR.parent)}:{imported.line}"
            found[f"{where}: {source} → {target} ({imported.target})"] = None
    return list(found)


def test_imports_point_down() -> None:
    bad = arrows_up()
    assert not bad, "imports running back up the layers (move the shared piece down):\n" + "\n".join(bad)


def test_facades_are_listed_present_and_unused_inside() -> None:
    modules = package_modules()
    for facade, presented in FACADES.items():
        assert facade in modules, f"facade {facade} is in the table but not in the package"
        named = {found.target for found in package_imports() if found.module == facade}
        assert any(t == presented or t.startswith(presented + ".") for t in named), (
            f"{facade} does not import {presented}"
        )
    used = [
        f"{found.path.relative_to(PACKAGE_DIR.parent)}:{found.line}: imports facade {found.target}"
        for found in package_imports()
        if found.module not in FACADES and found.module != FACADE_TABLE
        if found.target in FACADES or found.target == FACADE_TABLE
    ]
    assert not used, "the package imports its facades (import what they present instead):\n" + "\n".join(used)


def test_refused_modules_import_only_the_refusal_and_are_unused_inside() -> None:
    """A module of an unbuilt NeMo-RL feature imports the refusal helper and nothing else, holds no module under it,
    and nothing inside the package imports it (the one-line stop is for users' imports)."""
    modules = package_modules()
    for refused in REFUSED:
        assert refused in modules, f"refused module {refused} is in the table but not in the package"
        named = {found.target for found in package_imports() if found.module == refused}
        assert named == {REFUSAL}, f"{refused} imports {sorted(named)}; a refused module imports only {REFUSAL}"
        under = [name for name in modules if name.startswith(refused + ".")]
        assert not under, f"{refused} refuses every module under it, yet holds {under}"
    used = [
        f"{found.path.relative_to(PACKAGE_DIR.parent)}:{found.line}: imports refused {found.target}"
        for found in package_imports()
        if found.module not in REFUSED and found.module != FACADE_TABLE
        if any(found.target == refused or found.target.startswith(refused + ".") for refused in REFUSED)
    ]
    assert not used, "the package imports a refused module (it stops on import):\n" + "\n".join(used)


def test_scan_reads_every_kind_of_import(tmp_path: Path) -> None:
    """Function-local, TYPE_CHECKING, relative and string imports all count, each with its line."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from nemo_rl_clone.models import policy\n"
        "def f():\n"
        "    from ..algorithms import loss\n"
        "LAZY = {'x': 'nemo_rl_clone.evals.run:main'}\n"
        "import nemo_rl_clone.contract.loss\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = {(i.line, i.target) for i in imports_of(f"{PACKAGE}.data.probe", path, {f"{PACKAGE}.models.policy": path})}
    assert found == {
        (3, f"{PACKAGE}.models.policy"),
        (5, f"{PACKAGE}.algorithms"),
        (6, f"{PACKAGE}.evals.run"),
        (7, f"{PACKAGE}.contract.loss"),
    }

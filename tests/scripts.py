"""Loading the repository's scripts (examples/, tools/, converters: files, not package modules) in a test process."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None, register: bool = False) -> ModuleType:
    """The module of the script at ``path`` (named ``name``, default its stem); ``register`` puts it in
    ``sys.modules`` (dataclasses defined in it look their module up there)."""
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def entry_point_main(script: str) -> Callable[[list[str]], None]:
    """``main`` of ``examples/<script>.py``, e.g. ``entry_point_main("run_sft")``."""
    if str(REPO / "examples") not in sys.path:
        sys.path.insert(0, str(REPO / "examples"))  # run_grpo.py imports run_grpo_math as its sibling
    return load_script(REPO / "examples" / f"{script}.py").main

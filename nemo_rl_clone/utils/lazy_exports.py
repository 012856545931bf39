"""Package faces whose names load on first use: ``from nemo_rl_clone.algorithms.sft import SFTMasterConfig`` must not
load torch and the training code, so that an entry point validates a config before anything heavy loads."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from submodule ``package.<where[name]>``."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__

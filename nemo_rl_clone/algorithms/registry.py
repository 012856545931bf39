"""Algorithms by name: what the entry points, pre-flight and the dry run look an algorithm up in.

    config_class("grpo")          # the whole-run schema, imported without torch: a typo fails in a second
    get_algorithm("grpo")         # the `interfaces.Algorithm` (imports the algorithm's package)
    algorithm_for(config)         # the algorithm whose schema ``config`` is, or None (evaluation)
    register_algorithm("mine", "my_pkg.config:MyConfig", "my_pkg.algorithm:MY_ALGORITHM")   # a plug-in

Entries are ``"module:attribute"`` strings, imported on first use: registering costs nothing, and an algorithm's
heavy imports happen only when a run uses it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.interfaces import Algorithm


@dataclass(frozen=True)
class _Entry:
    config: str  # "module:Class" of the whole-run config schema
    algorithm: str  # "module:attribute" of the `Algorithm` instance
    title: str  # how the entry point and the progress bar name it


_PACKAGE = "nemo_rl_clone.algorithms"
_REGISTRY: dict[str, _Entry] = {
    "grpo": _Entry(f"{_PACKAGE}.grpo.config:GRPOMasterConfig", f"{_PACKAGE}.grpo.train:ALGORITHM", "GRPO"),
    "distillation": _Entry(
        f"{_PACKAGE}.distillation.config:DistillationMasterConfig",
        f"{_PACKAGE}.distillation.train:ALGORITHM",
        "Distillation",
    ),
    "sft": _Entry(f"{_PACKAGE}.sft.config:SFTMasterConfig", f"{_PACKAGE}.sft.train:ALGORITHM", "SFT"),
    "dpo": _Entry(f"{_PACKAGE}.dpo.config:DPOMasterConfig", f"{_PACKAGE}.dpo.train:ALGORITHM", "DPO"),
    "rm": _Entry(f"{_PACKAGE}.rm.config:RMMasterConfig", f"{_PACKAGE}.rm.train:ALGORITHM", "RM"),
    "ppo": _Entry(f"{_PACKAGE}.ppo.config:PPOMasterConfig", f"{_PACKAGE}.ppo.train:ALGORITHM", "PPO"),
}


def register_algorithm(name: str, config: str, algorithm: str, title: str | None = None) -> None:
    """Add (or replace) algorithm ``name``: ``config`` and ``algorithm`` are ``"module:attribute"`` paths."""
    for path in (config, algorithm):
        if ":" not in path:
            raise ValueError(f"register_algorithm({name!r}): {path!r} is not 'module:attribute'")
    _REGISTRY[name] = _Entry(config, algorithm, title or name)


def title(name: str) -> str:
    return _entry(name).title


def algorithm_names() -> list[str]:
    return sorted(_REGISTRY)


def config_class(name: str) -> type:
    return _load(_entry(name).config)


def get_algorithm(name: str) -> Algorithm:
    return _load(_entry(name).algorithm)


def algorithm_for(config: Any) -> Algorithm | None:
    """The registered algorithm whose config schema ``config`` is an instance of; None for any other config."""
    for name in _REGISTRY:
        if type(config) is config_class(name):
            return get_algorithm(name)
    return None


def _entry(name: str) -> _Entry:
    if name not in _REGISTRY:
        raise KeyError(f"no algorithm {name!r}; registered: {', '.join(algorithm_names())}")
    return _REGISTRY[name]


def _load(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)

"""Algorithms by name: what the entry points, pre-flight and the dry run look an algorithm up in.

    config_class("grpo")          # the whole-run schema, imported without torch: a typo fails in a second
    get_algorithm("grpo")         # the `interfaces.Algorithm` (imports the algorithm's package)
    algorithm_for(config)         # the algorithm whose schema ``config`` is, or None (evaluation)
    register_algorithm("mine", "my_pkg.config:MyConfig", "my_pkg.algorithm:MY_ALGORITHM")   # a plug-in

An entry is a `Registry` entry (`nemo_rl_clone.utils.registry`) holding ``"module:attribute"`` paths, imported on
first use: registering costs nothing, and an algorithm's heavy imports happen only when a run uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_clone.utils.registry import Registry, is_import_path, load_import_path

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.interfaces import Algorithm


@dataclass(frozen=True)
class _Entry:
    config: str  # "module:Class" of the whole-run config schema
    algorithm: str  # "module:attribute" of the `Algorithm` instance
    title: str  # how the entry point and the progress bar name it


ALGORITHMS: Registry[_Entry] = Registry("algorithm", "algorithm")


def register_algorithm(name: str, config: str, algorithm: str, title: str | None = None) -> None:
    """Add (or replace) algorithm ``name``: ``config`` and ``algorithm`` are ``"module:attribute"`` paths."""
    for path in (config, algorithm):
        if not is_import_path(path):
            raise ValueError(f"register_algorithm({name!r}): {path!r} is not 'module:attribute'")
    ALGORITHMS.register(name, _Entry(config, algorithm, title or name))


def unregister_algorithm(name: str) -> None:
    ALGORITHMS.unregister(name)


def title(name: str) -> str:
    return _entry(name).title


def algorithm_names() -> list[str]:
    return ALGORITHMS.names()


def config_class(name: str) -> type:
    loaded: type = load_import_path(_entry(name).config, ALGORITHMS.key)
    return loaded


def get_algorithm(name: str) -> Algorithm:
    loaded: Algorithm = load_import_path(_entry(name).algorithm, ALGORITHMS.key)
    return loaded


def algorithm_for(config: Any) -> Algorithm | None:
    """The registered algorithm whose config schema ``config`` is an instance of; None for any other config."""
    for name in ALGORITHMS:
        if type(config) is config_class(name):
            return get_algorithm(name)
    return None


def _entry(name: str) -> _Entry:
    if name not in ALGORITHMS:  # a programming error (entry points pass their own name): KeyError, not user input
        raise KeyError(f"no algorithm {name!r}; registered: {', '.join(algorithm_names())}")
    return ALGORITHMS.resolve(name)


_PACKAGE = "nemo_rl_clone.algorithms"
for _name, _schema, _title in (
    ("grpo", "GRPOMasterConfig", "GRPO"),
    ("distillation", "DistillationMasterConfig", "Distillation"),
    ("sft", "SFTMasterConfig", "SFT"),
    ("dpo", "DPOMasterConfig", "DPO"),
    ("rm", "RMMasterConfig", "RM"),
    ("ppo", "PPOMasterConfig", "PPO"),
):
    register_algorithm(_name, f"{_PACKAGE}.{_name}.config:{_schema}", f"{_PACKAGE}.{_name}.train:ALGORITHM", _title)

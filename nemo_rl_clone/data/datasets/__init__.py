"""Dataset registry: ``data.dataset_name`` → loader returning a :class:`LoadedDataset` in the common row form.

Loader modules are imported on first use, so importing this package (e.g. to validate a config) stays cheap.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.data.config import DataConfig
    from nemo_rl_clone.data.datasets.common import LoadedDataset

# NeMo-RL's names at its path (``nemo_rl.data.datasets``), loaded on first use: name → submodule.
_NEMO_RL_NAMES = {
    "AllTaskProcessedDataset": "common",
    "load_eval_dataset": "eval_datasets",
    "load_preference_dataset": "preference_datasets",
    "load_response_dataset": "response_datasets",
    "assert_no_double_bos": "utils",
    "extract_necessary_env_names": "utils",
    "merge_datasets": "utils",
    "update_single_dataset_config": "utils",
}
__getattr__ = lazy_getattr(__name__, _NEMO_RL_NAMES)

# NeMo-RL's names where it has them ("OpenMathInstruct-2", "DeepScaler", "DAPOMath17K").
_LOADERS: dict[str, str] = {
    "OpenMathInstruct-2": "nemo_rl_clone.data.datasets.openmathinstruct2:load_openmathinstruct2",
    "DeepScaler": "nemo_rl_clone.data.datasets.deepscaler:load_deepscaler",
    "DAPOMath17K": "nemo_rl_clone.data.datasets.dapo_math:load_dapo_math",
    "aime2024": "nemo_rl_clone.data.datasets.aime2024:load_aime2024",
    "math500": "nemo_rl_clone.data.datasets.math500:load_math500",
    "gsm8k": "nemo_rl_clone.data.datasets.gsm8k:load_gsm8k",
    "reasoning_gym": "nemo_rl_clone.data.datasets.reasoning_gym:load_reasoning_gym",
    "human_eval": "nemo_rl_clone.data.datasets.human_eval:load_human_eval",
    "local": "nemo_rl_clone.data.datasets.local_math:load_local_math",
    "sliding_puzzle": "nemo_rl_clone.data.datasets.sliding_puzzle:load_sliding_puzzle",
}
DATASET_NAMES: tuple[str, ...] = tuple(_LOADERS)


class DataError(UserInputError, ValueError):
    """The data the config names is unusable: an unknown dataset, a missing field in a row, an impossible split.
    The message names the key, file and row."""


# DataConfig keys passed to loaders when set.
_FILE_KEYS = ("data_path", "val_data_path", "split", "split_validation_size")


def unknown_dataset_message(name: str, names: Sequence[str] = DATASET_NAMES) -> str:
    """The error text for an unknown dataset name: the valid ``names`` and the closest one."""
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    near = near or [n for n in names if n.lower() == name.lower()]
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"unknown dataset {name!r}{hint}; valid names: {', '.join(names)}"


def get_dataset_loader(name: str) -> Callable[..., LoadedDataset]:
    """The loader function registered under ``name``; raises ``ValueError`` listing the valid names."""
    if name not in _LOADERS:
        raise DataError(unknown_dataset_message(name))
    module_name, function_name = _LOADERS[name].split(":")
    return getattr(importlib.import_module(module_name), function_name)


def load_dataset_by_name(name: str, **kwargs: Any) -> LoadedDataset:
    """Load dataset ``name`` with loader keyword arguments ``kwargs`` (e.g. ``data_path=...``, ``seed=...``)."""
    loader = get_dataset_loader(name)
    accepted = list(inspect.signature(loader).parameters)
    unexpected = sorted(set(kwargs) - set(accepted))
    if unexpected:
        raise TypeError(f"dataset {name!r} does not take {unexpected}; its arguments: {accepted}")
    return loader(**kwargs)


def seed_argument(name: str, seed: int) -> dict[str, int]:
    """``{"seed": seed}`` when dataset ``name``'s loader takes a seed (for its hold-out), else ``{}``."""
    return {"seed": seed} if "seed" in inspect.signature(get_dataset_loader(name)).parameters else {}


def load_dataset_from_config(data_config: DataConfig, seed: int, env: Mapping[str, Any] | None = None) -> LoadedDataset:
    """Load the dataset a ``data`` config section describes; ``seed`` (e.g. ``grpo.seed``) seeds splits; ``env``
    (the ``env`` sections) gives generated games their rules (``sliding_puzzle``: ``env.sliding_puzzle_game``).

    A set key the dataset does not use (e.g. ``data.split`` for DeepScaler) raises a ``ValueError`` naming it.
    """
    name = data_config.dataset_name
    loader = get_dataset_loader(name)
    options: dict[str, Any] = {
        key: getattr(data_config, key) for key in _FILE_KEYS if getattr(data_config, key) is not None
    }
    if name == "reasoning_gym":
        if data_config.reasoning_gym is None:
            raise DataError("data.reasoning_gym: required when data.dataset_name is 'reasoning_gym'")
        # The section's fields are the loader's arguments (and carry their own seed).
        options.update(dataclasses.asdict(data_config.reasoning_gym))
    if name == "sliding_puzzle":
        game = (env or {}).get("sliding_puzzle_game")
        if data_config.sliding_puzzle is None or game is None:
            raise DataError(
                "data.sliding_puzzle and env.sliding_puzzle_game: both required for dataset 'sliding_puzzle'"
            )
        options.update(dataclasses.asdict(data_config.sliding_puzzle))
        options.update(dataclasses.asdict(game.cfg.game_config))
    accepted = set(inspect.signature(loader).parameters)
    unused = sorted(set(options) - accepted)
    if unused:
        raise DataError(f"data.{unused[0]}: not used by dataset {name!r}; set it to null")
    if "seed" in accepted:
        options.setdefault("seed", seed)
    return loader(**options)

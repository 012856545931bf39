"""NeMo-RL v0.7.0's data setup functions (``nemo_rl.data.utils``, presented at that path by `data.utils`) on this
library's dataset loading: the prompts and environments the ``data`` and ``env`` sections describe, built the way a
run's own setup builds them (`run.rollout.prompt_datasets`, `run.rollout.create_envs`); the preference pairs of DPO
and reward-model training as their setup loads them (`supervised.setup.preference_data`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from nemo_rl_clone.algorithms.run.rollout import create_envs, prompt_datasets
from nemo_rl_clone.algorithms.run.state import DATALOADER_FILE
from nemo_rl_clone.algorithms.supervised.setup import preference_data
from nemo_rl_clone.data.config import DataConfig, PreferenceDataConfig
from nemo_rl_clone.environments.config import EnvConfig
from nemo_rl_clone.utils.checkpoint import CONFIG_FILE
from nemo_rl_clone.utils.config_validation import as_config, config_to_dict
from nemo_rl_clone.utils.errors import UserInputError

__all__ = ["get_train_dataset_name", "load_dataloader_state", "setup_preference_data", "setup_response_data"]

# The seed of a validation hold-out (``data.train.split_validation_size``) when ``data.train.seed`` is not set:
# NeMo-RL's recipes set it to ``${grpo.seed}``, whose default this is.
DEFAULT_SPLIT_SEED = 42


@dataclass
class _ResponseDataSections:
    """The two sections `setup_response_data` reads, validated together so that a problem names its full key."""

    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)


def setup_response_data(
    tokenizer: Any, data_config: Any, env_configs: Any = None, is_vlm: bool = False
) -> tuple[Any, Any] | tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """The training and validation prompt datasets of ``data_config`` (NeMo-RL's ``data`` section, a dict or this
    library's `DataConfig`), tokenized with ``tokenizer``; with ``env_configs`` (the ``env`` section) also one
    environment actor per section, as ``(dataset, val_dataset, task_to_env, val_task_to_env)``: each table maps a
    row's task name to its environment. The validation dataset is None when the data has no validation rows. Needs
    Ray (`distributed.virtual_cluster.init_ray`) for the environments."""
    if is_vlm:
        raise UserInputError("is_vlm: not supported yet: vision and audio inputs (nemo_rl_clone trains text models)")
    sections = as_config({"data": data_config, "env": env_configs or {}}, _ResponseDataSections)
    data = sections.data
    dataset, val_dataset = prompt_datasets(data, sections.env, tokenizer, data.split_seed(DEFAULT_SPLIT_SEED))
    if env_configs is None:
        return dataset, val_dataset
    task_to_env = create_envs(sections.env)
    return dataset, val_dataset, task_to_env, dict(task_to_env)


def setup_preference_data(tokenizer: Any, data_config: Any) -> tuple[Any, Any]:
    """The training and validation preference datasets (DPO, reward models) of ``data_config`` (NeMo-RL's ``data``
    section, a dict or this library's `PreferenceDataConfig`), tokenized with ``tokenizer``; the validation dataset
    is None when the data has no validation rows."""
    data = as_config(data_config, PreferenceDataConfig, key="data")
    return preference_data(data, tokenizer, data.split_seed(DEFAULT_SPLIT_SEED))


def get_train_dataset_name(data_config: Any) -> str | None:
    """The training ``dataset_name`` of a ``data`` section (a dict or this library's `DataConfig`): that of
    ``train`` (a dict, or the first of a list), else this library's flat ``dataset_name``; None when there is none."""
    if not data_config:
        return None
    data = data_config if isinstance(data_config, Mapping) else config_to_dict(data_config)
    train = data.get("train")
    if isinstance(train, list):
        train = train[0] if train else None
    if isinstance(train, Mapping) and train.get("dataset_name") is not None:
        return train["dataset_name"]
    return data.get("dataset_name")


def load_dataloader_state(dataloader: Any, checkpoint_path: str | Path, data_config: Any, suffix: str = "") -> None:
    """Restore ``dataloader``'s position from ``<checkpoint_path>/train_dataloader<suffix>.pt`` — unless the
    checkpoint's ``config.yaml`` names another training dataset than ``data_config``: then the new dataset starts
    from its first row (a printed line says so) instead of skipping rows of a position it never had."""
    folder = Path(checkpoint_path)
    saved = torch.load(folder / DATALOADER_FILE.replace(".pt", f"{suffix}.pt"), weights_only=False)
    if (folder / CONFIG_FILE).exists():
        saved_name = get_train_dataset_name((yaml.safe_load((folder / CONFIG_FILE).read_text()) or {}).get("data"))
        current_name = get_train_dataset_name(data_config)
        if saved_name is not None and current_name is not None and saved_name != current_name:
            print(
                f"Dataset swap detected: was {saved_name!r}, now {current_name!r}. Skipping dataloader state "
                "restore; new dataset starts from index 0.",
                flush=True,
            )
            return
    # this library's runs save the loader position beside the RNG states; NeMo-RL's save the position alone
    is_run_state = isinstance(saved, Mapping) and set(saved) == {"dataloader", "rng"}
    dataloader.load_state_dict(saved["dataloader"] if is_run_state else saved)

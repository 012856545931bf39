"""NeMo-RL v0.7.0's per-dataset loading of SFT data, as its ``examples/run_sft.py`` builds its datasets: one entry of
``data.train`` / ``data.validation`` (defaults from ``data.default``, `update_single_dataset_config`) loaded by
`load_response_dataset` into an object with NeMo-RL's ``RawDataset`` attributes, the entries' rows joined by
`merge_datasets`, then processed by `AllTaskProcessedDataset` with each dataset's ``processor``. The rows come from
this library's SFT loaders (`datasets.sft`: the same formats, files and hub copies as ``data.dataset_name``), and
``sft_processor`` builds the datums an SFT run trains on (`data.supervised.build_sft_datum`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import datasets
import torch.utils.data

from nemo_rl_clone.data.config import SFTDataConfig
from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import Rows
from nemo_rl_clone.data.datasets.sft import load_chat_format, prompt_spec, sft_chat_format
from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.errors import UserInputError

__all__ = [
    "ResponseDatasetConfig",
    "load_response_dataset",
    "merge_datasets",
    "sft_processor",
    "update_single_dataset_config",
]

# The seed of a hold-out (``split_validation_size``) when the entry sets none: NeMo-RL's default.
DEFAULT_SEED = 42


@dataclass
class ResponseDatasetConfig:
    """One entry of ``data.train`` / ``data.validation`` (NeMo-RL's ``ResponseDatasetConfig`` keys). ``split``:
    the rows of a hub dataset to load (``validation``/``test``: its validation rows); a local ``data_path`` is read
    whole. ``processor``: ``sft_processor`` (the SFT datums this library trains on)."""

    dataset_name: str
    data_path: str | None = None
    input_key: str | None = None
    output_key: str | None = None
    subset: str | None = None
    split: str | None = None
    prompt_file: str | None = None
    system_prompt_file: str | None = None
    env_name: str | None = None
    processor: str = "sft_processor"
    download_dir: str | None = None
    split_validation_size: float = 0.0
    seed: int = DEFAULT_SEED

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if self.processor != "sft_processor":
            problems.append(("processor", f"not supported yet: {self.processor!r}; use sft_processor (SFT data)"))
        for key in ("input_key", "output_key", "subset", "download_dir"):
            if getattr(self, key) is not None:
                problems.append((key, "not supported yet: the SFT formats here read their own columns; set it to null"))
        return problems


@dataclass
class ResponseDataset:
    """A loaded entry with NeMo-RL's ``RawDataset`` attributes: ``dataset`` (its rows, each with ``task_name``),
    ``val_dataset`` (the ``split_validation_size`` hold-out, else None), ``processor``, ``task_spec``,
    ``task_name`` (the dataset's name) and no ``preprocessor``."""

    data_config: dict[str, Any]
    dataset: Rows
    val_dataset: Rows | None
    processor: Callable[..., dict[str, Any]]
    task_spec: TaskDataSpec
    task_name: str
    preprocessor: Callable[[Any], Any] | None = None


def update_single_dataset_config(data_config: MutableMapping[str, Any], default_data_config: Mapping[str, Any]) -> None:
    """Fill ``data_config`` (one dataset entry) in place with the keys of ``default_data_config`` it lacks."""
    for key, value in default_data_config.items():
        data_config.setdefault(key, value)


def merge_datasets(datasets_to_merge: list[Any]) -> Any:
    """One dataset of the rows of all: the one itself, Hugging Face datasets concatenated, others chained."""
    if not datasets_to_merge:
        raise ValueError("merge_datasets: expected at least one dataset")
    if len(datasets_to_merge) == 1:
        return datasets_to_merge[0]
    if all(isinstance(part, datasets.Dataset) for part in datasets_to_merge):
        return datasets.concatenate_datasets(datasets_to_merge)
    return torch.utils.data.ConcatDataset(datasets_to_merge)


def load_response_dataset(data_config: Mapping[str, Any]) -> ResponseDataset:
    """The dataset one ``data.train`` / ``data.validation`` entry names (a dict, `ResponseDatasetConfig` keys)."""
    entry = as_config(data_config, ResponseDatasetConfig, key="data")
    name = entry.dataset_name
    omi2 = name == "OpenMathInstruct-2"
    sft = as_config(
        {"dataset_name": name, "data_path": entry.data_path, "split": entry.split if omi2 else None},
        SFTDataConfig,
        key="data",
    )
    if name == "champ":
        raise UserInputError(
            "data.dataset_name: 'champ' is not a response dataset (its SFT rows load with setup(config))"
        )
    validation_rows = entry.split in ("validation", "test") and not omi2 and entry.data_path is None
    fmt, convert = sft_chat_format(sft)
    spec = prompt_spec(name, entry.prompt_file, entry.system_prompt_file)
    hold_out = None if validation_rows else entry.split_validation_size
    loaded = load_chat_format(fmt, convert, entry.data_path, None, hold_out, entry.seed, spec)
    rows = loaded.validation if validation_rows else loaded.train
    if rows is None:
        raise DataError(f"data.split: dataset {name!r} has no {entry.split!r} rows")
    val_rows = None if validation_rows else loaded.validation
    return ResponseDataset(
        data_config=dict(data_config),
        dataset=_with_task_name(rows, name),
        val_dataset=None if val_rows is None else _with_task_name(val_rows, name),
        processor=sft_processor,
        task_spec=TaskDataSpec(name, entry.prompt_file, entry.system_prompt_file),
        task_name=name,
    )


def _with_task_name(rows: Rows, name: str) -> Rows:
    if isinstance(rows, datasets.Dataset):
        return rows.add_column("task_name", [name] * len(rows))
    return [{**row, "task_name": name} for row in rows]


def sft_processor(
    datum_dict: Mapping[str, Any],
    task_data_spec: TaskDataSpec | None,
    tokenizer: Any,
    max_seq_length: int | None,
    idx: int,
    add_bos: bool = True,
    add_eos: bool = True,
    add_generation_prompt: bool = False,
) -> dict[str, Any]:
    """An SFT row (``messages``; the prompt files were applied when it loaded) → the datum an SFT run trains on
    (`data.supervised.build_sft_datum`: assistant tokens trained, ``loss_multiplier`` 0 when truncated)."""
    from nemo_rl_clone.data.supervised import build_sft_datum

    if max_seq_length is None:
        raise UserInputError("max_seq_length: required by sft_processor (data.max_input_seq_length)")
    datum = build_sft_datum(
        datum_dict["messages"], tokenizer, max_seq_length, idx, add_bos, add_eos, add_generation_prompt
    )
    datum["task_name"] = datum_dict.get("task_name")
    return datum

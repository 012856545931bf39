"""NeMo-RL v0.7.0's ``RawDataset`` (``nemo_rl.data.datasets.raw_dataset``): the base of its dataset classes. A
dataset class loads its rows into ``dataset`` already in NeMo-RL's message form (``format_data``), optionally holds
some out as ``val_dataset``, and is bound to a prompt spec (``set_task_spec``) and a processor (``set_processor``).

Rows come from this library's readers (`common.load_raw_rows`: the hub, or a local file given as ``data_path``, with
one-line errors), so a class built from NeMo-RL's arguments reads what our loader of the same dataset reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import datasets

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import load_raw_rows
from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.utils.errors import UserInputError

__all__ = ["RawDataset", "ending_with_assistant", "sample_rows", "task_name_from_path"]


class RawDataset:
    """NeMo-RL's dataset base: ``dataset`` (rows with ``task_name``), ``val_dataset`` (the hold-out when this one
    dataset gives both training and validation rows, else None), ``processor``, ``task_spec``, ``preprocessor``."""

    data_config: Mapping[str, Any]
    dataset: Any
    val_dataset: Any | None
    processor: Callable[..., Any]
    task_spec: TaskDataSpec
    preprocessor: Callable[[Any], Any] | None = None
    task_name: str

    def split_train_validation(self, test_size: float | int, seed: int) -> None:
        """Hold out ``test_size`` rows (a fraction below 1, or a count) as ``val_dataset``, shuffled by ``seed``;
        0 keeps every row for training."""
        if test_size > 0:
            # A whole count may arrive as a float (an int recipe value merged over a float default).
            size = int(test_size) if test_size >= 1 else test_size
            parts = self.dataset.train_test_split(test_size=size, seed=seed)
            self.dataset, self.val_dataset = parts["train"], parts["test"]

    def set_processor(self) -> None:
        """Bind the processor ``data_config["processor"]`` names in ``data.processors.PROCESSOR_REGISTRY``
        (``default`` when unset)."""
        name = self.data_config.get("processor", "default")
        registry = _processor_registry()
        if name not in registry:
            raise UserInputError(f"data.processor: not supported yet: {name!r}; registered: {sorted(registry)}")
        self.processor = registry[name]

    def set_task_spec(self, data_config: Mapping[str, Any]) -> None:
        """Keep ``data_config`` and build the prompt spec from its ``prompt_file`` / ``system_prompt_file``."""
        self.data_config = data_config
        self.task_spec = TaskDataSpec(
            task_name=self.task_name,
            prompt_file=data_config.get("prompt_file"),
            system_prompt_file=data_config.get("system_prompt_file"),
        )

    def load_formatted(
        self, hub_id: str, split: str, data_path: str | Path | None, subset: str | None = None
    ) -> datasets.Dataset:
        """Rows of ``hub_id`` (``split``, ``subset``) — or of the local file ``data_path`` in the same format —
        mapped through ``format_data`` to NeMo-RL's form; the source columns are dropped."""
        raw = load_raw_rows(self.task_name, hub_id, split, None if data_path is None else str(data_path), subset)
        return raw.map(self.format_data, remove_columns=raw.column_names)

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} defines no format_data")


def task_name_from_path(data_path: str | Path) -> str:
    """NeMo-RL's task name of a file dataset: its folder and file name joined by ``-``, without the extension
    (``data/math/train.jsonl`` → ``math-train``)."""
    name = "-".join(str(data_path).split("/")[-2:]).split(".")[0]
    return name[1:] if name.startswith("-") else name


def sample_rows(rows: datasets.Dataset, max_samples: int | None, seed: int) -> datasets.Dataset:
    """At most ``max_samples`` rows (None or ≤ 0: all), picked by a shuffle seeded with ``seed``."""
    if max_samples is None or max_samples <= 0:
        return rows
    return rows.shuffle(seed=seed).select(range(min(max_samples, len(rows))))


def ending_with_assistant(messages: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """``messages`` when the last is the assistant's (the turn trained on); else a one-line error."""
    if not messages or messages[-1]["role"] != "assistant":
        raise DataError(f"{source}: the last message must be the assistant's, got: {messages}")
    return messages


def _processor_registry() -> dict[str, Callable[..., Any]]:
    from nemo_rl_clone.data.nemo_rl_processors import PROCESSOR_REGISTRY  # loads the datum builders: on use only

    return PROCESSOR_REGISTRY

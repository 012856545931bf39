"""NeMo-RL's ``OpenAIFormatDataset``: a local JSON Lines file of OpenAI-style conversations (``chat_key``), with an
optional system message and tool list, and ``PreservingDataset``, rows kept exactly as written (tool calls whose
arguments differ from row to row would get ``None``-filled keys in a Hugging Face dataset)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset, task_name_from_path
from nemo_rl_clone.data.datasets.sft import read_json_rows


class PreservingDataset:
    """A list of row dicts with a dataset's reading interface: ``len``, ``rows[i]`` (negative too), slices, lists
    of indices, iteration and ``map``."""

    def __init__(self, data: list[dict[str, Any]]) -> None:
        self.data = data
        self.features = None  # a Hugging Face dataset's attribute; these rows have no common schema

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx: int | slice | list[int]) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(idx, slice):
            return self.data[idx]
        if isinstance(idx, list):
            return [self.data[i] for i in idx]
        if isinstance(idx, int):
            if not -len(self.data) <= idx < len(self.data):
                raise IndexError(f"Index {idx} out of range for dataset of size {len(self.data)}")
            return self.data[idx]
        raise TypeError(f"Indices must be integers, slices, or lists, not {type(idx)}")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.data)

    def map(self, function: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> PreservingDataset:
        """A new dataset of ``function(row)`` (``with_indices=True``: ``function(row, index)``)."""
        if kwargs.get("with_indices", False):
            return PreservingDataset([function(row, index) for index, row in enumerate(self.data)])
        return PreservingDataset([function(row) for row in self.data])


class OpenAIFormatDataset(RawDataset):
    """Rows ``{chat_key: [{"role", "content"}, ...], tool_key: [...]}`` ending with the assistant's turn; the
    task name is the file's folder and name. ``system_key`` (a column) or else ``system_prompt`` becomes a leading
    system message."""

    def __init__(
        self,
        data_path: str | Path,
        chat_key: str = "messages",
        system_key: str | None = None,
        system_prompt: str | None = None,
        tool_key: str | None = "tools",
        use_preserving_dataset: bool = False,
        **kwargs: Any,
    ) -> None:
        self.chat_key = chat_key
        self.system_key = system_key
        self.system_prompt = system_prompt
        self.tool_key = tool_key
        self.task_name = task_name_from_path(data_path)
        self.val_dataset = None
        if not Path(data_path).is_file():
            raise DataError(f"data.data_path: file {str(data_path)!r} does not exist")
        if use_preserving_dataset:
            rows = read_json_rows(str(data_path), self.task_name)
            self.dataset: Any = PreservingDataset([self.format_data(row) for row in rows])
            return
        raw = datasets.load_dataset("json", data_files=str(data_path), split="train")
        self.dataset = raw.map(self.format_data)
        if tool_key and tool_key in self.dataset.column_names:
            warnings.warn(
                "Tools detected in dataset. Set use_preserving_dataset=True to keep each row's tool schema as "
                "written: a Hugging Face dataset fills the keys a row lacks with None.",
                UserWarning,
                stacklevel=2,
            )

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        messages = list(data[self.chat_key])
        if self.system_key is not None and self.system_key in data:
            messages = [{"role": "system", "content": data[self.system_key]}, *messages]
        elif self.system_prompt:
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        if messages[-1]["role"] != "assistant":
            raise DataError(f"{self.task_name}: the last message must be the assistant's, got {messages[-1]}")
        row = {"messages": messages, "task_name": self.task_name}
        if self.tool_key and self.tool_key in data:
            row["tools"] = data[self.tool_key]
        return row

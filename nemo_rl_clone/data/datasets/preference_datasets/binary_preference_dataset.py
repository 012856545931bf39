"""NeMo-RL's ``BinaryPreferenceDataset``: rows ``{prompt, chosen, rejected}`` from a local file or a hub dataset,
turned into its preference form (the chosen response ranked 0, the rejected one 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.raw_dataset import RawDataset, task_name_from_path
from nemo_rl_clone.data.datasets.utils import load_dataset_from_path


def ranked_pair(context: list[dict[str, Any]], chosen: str, rejected: str, task_name: str) -> dict[str, Any]:
    """NeMo-RL's preference row: ``context``, and the chosen (rank 0) and rejected (rank 1) assistant replies."""
    return {
        "context": context,
        "completions": [
            {"rank": 0, "completion": [{"role": "assistant", "content": chosen}]},
            {"rank": 1, "completion": [{"role": "assistant", "content": rejected}]},
        ],
        "task_name": task_name,
    }


class BinaryPreferenceDataset(RawDataset):
    """``prompt_key`` (text: one user message; a list: the conversation so far), ``chosen_key`` and
    ``rejected_key`` columns; the task name is the file's folder and name."""

    def __init__(
        self,
        data_path: str | Path,
        prompt_key: str = "prompt",
        chosen_key: str = "chosen",
        rejected_key: str = "rejected",
        subset: str | None = None,
        split: str | None = None,
        **kwargs: Any,
    ):
        self.prompt_key = prompt_key
        self.chosen_key = chosen_key
        self.rejected_key = rejected_key
        self.task_name = task_name_from_path(data_path)
        rows = load_dataset_from_path(data_path, subset, split)
        self.dataset = rows.map(self.format_data, remove_columns=rows.column_names)
        self.val_dataset = None

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        prompt = data[self.prompt_key]
        context = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        return ranked_pair(context, data[self.chosen_key], data[self.rejected_key], self.task_name)

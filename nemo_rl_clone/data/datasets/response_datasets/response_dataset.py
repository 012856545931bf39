"""NeMo-RL's ``ResponseDataset``: prompt/response rows from a local file or a hub dataset, read by
`utils.load_dataset_from_path`; rows that already hold ``messages`` are kept as they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.raw_dataset import RawDataset, task_name_from_path
from nemo_rl_clone.data.datasets.utils import load_dataset_from_path


class ResponseDataset(RawDataset):
    """Rows ``{input_key: prompt, output_key: response}`` → user and assistant messages; the task name is the
    file's folder and name (`task_name_from_path`). ``split_validation_size`` of the rows are held out with
    ``seed``."""

    def __init__(
        self,
        data_path: str | Path,
        input_key: str = "input",
        output_key: str = "output",
        subset: str | None = None,
        split: str | None = None,
        split_validation_size: float = 0,
        seed: int = 42,
        **kwargs: Any,
    ) -> None:
        self.input_key = input_key
        self.output_key = output_key
        self.task_name = task_name_from_path(data_path)
        rows = load_dataset_from_path(data_path, subset, split)
        if "messages" in rows.column_names:
            self.dataset = rows.add_column("task_name", [self.task_name] * len(rows))
        else:
            self.dataset = rows.map(self.format_data, remove_columns=rows.column_names)
        self.val_dataset = None
        self.split_train_validation(split_validation_size, seed)

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "messages": [
                {"role": "user", "content": data[self.input_key]},
                {"role": "assistant", "content": data[self.output_key]},
            ],
            "task_name": self.task_name,
        }

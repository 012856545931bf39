"""NeMo-RL's ``SquadDataset`` (``rajpurkar/squad``): system = the context, user = the question, assistant = the
first answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.raw_dataset import RawDataset


class SquadDataset(RawDataset):
    """SQuAD's ``split`` rows (``data_path``: a local file in the hub's format instead)."""

    def __init__(self, split: str = "train", data_path: str | Path | None = None, **kwargs: Any) -> None:
        self.task_name = "squad"
        self.val_dataset = None
        self.dataset = self.load_formatted("rajpurkar/squad", split, data_path)

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "messages": [
                {"role": "system", "content": data["context"]},
                {"role": "user", "content": data["question"]},
                {"role": "assistant", "content": data["answers"]["text"][0]},
            ],
            "task_name": self.task_name,
        }

"""NeMo-RL's ``NemotronCascade2SFTMathDataset``: the ``math`` subset of ``nvidia/Nemotron-Cascade-2-SFT-Data``,
rows already in chat form (``messages``, ending with the assistant's turn)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.common import load_raw_rows
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset, ending_with_assistant, sample_rows


class NemotronCascade2SFTMathDataset(RawDataset):
    """The hub's ``split`` rows (``data_path``: a local file in its format), at most ``max_samples`` (a seeded
    shuffle picks which), ``split_validation_size`` held out with ``seed``."""

    def __init__(
        self,
        split: str = "train",
        split_validation_size: float = 0.05,
        seed: int = 42,
        max_samples: int | None = None,
        data_path: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        self.task_name = "Nemotron-Cascade-2-SFT-Math"
        path = None if data_path is None else str(data_path)
        raw = load_raw_rows(self.task_name, "nvidia/Nemotron-Cascade-2-SFT-Data", split, path, "math")
        rows = sample_rows(raw, max_samples, seed)
        self.dataset = rows.map(self.format_data, remove_columns=rows.column_names)
        self.val_dataset = None
        self.split_train_validation(split_validation_size, seed)

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"messages": ending_with_assistant(data["messages"], self.task_name), "task_name": self.task_name}

"""NeMo-RL's ``Tulu3SftMixtureDataset`` (``allenai/tulu-3-sft-mixture``): rows already hold ``messages``; each must
end with the assistant's turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.common import load_raw_rows
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset, ending_with_assistant, sample_rows


class Tulu3SftMixtureDataset(RawDataset):
    """The hub's train rows (``data_path``: a local file in its format), at most ``max_samples`` of them (a seeded
    shuffle picks which), ``split_validation_size`` held out with ``seed``."""

    def __init__(
        self,
        split_validation_size: float = 0.05,
        seed: int = 42,
        max_samples: int | None = None,
        data_path: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        self.task_name = "tulu3_sft_mixture"
        path = None if data_path is None else str(data_path)
        rows = sample_rows(
            load_raw_rows(self.task_name, "allenai/tulu-3-sft-mixture", "train", path), max_samples, seed
        )
        # NeMo-RL drops only the bookkeeping columns: ``messages`` stays the row's conversation.
        dropped = [name for name in ("id", "source") if name in rows.column_names]
        self.dataset = rows.map(self.format_data, remove_columns=dropped)
        self.val_dataset = None
        self.split_train_validation(split_validation_size, seed)

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        ending_with_assistant(data["messages"], self.task_name)
        return {"task_name": self.task_name}

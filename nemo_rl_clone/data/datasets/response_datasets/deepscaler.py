"""NeMo-RL's ``DeepScalerDataset`` (``agentica-org/DeepScaleR-Preview-Dataset``): user = ``problem``, assistant =
``answer``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.raw_dataset import RawDataset


class DeepScalerDataset(RawDataset):
    """The hub's train rows (``data_path``: a local file in its format)."""

    def __init__(self, data_path: str | Path | None = None, **kwargs: Any) -> None:
        self.task_name = "DeepScaler"
        self.val_dataset = None
        self.dataset = self.load_formatted("agentica-org/DeepScaleR-Preview-Dataset", "train", data_path)

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "messages": [
                {"role": "user", "content": data["problem"]},
                {"role": "assistant", "content": data["answer"]},
            ],
            "task_name": self.task_name,
        }

"""NeMo-RL's ``AIMEDataset`` response class (``dataset_name: AIME2024``, a GRPO or distillation run's validation set):
user = ``problem``, assistant = ``answer``, the whole set repeated ``repeat`` times (each copy sampled anew). AIME 2024
is read from the hub copy this library's ``aime2024`` loader reads; 2025 and 2026 are not shipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import datasets

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.aime2024 import HUB_ID, HUB_SPLIT
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset

AIMEVariant = Literal["2024", "2025", "2026"]


class AIMEDataset(RawDataset):
    """AIME ``variant``'s problems (``data_path``: a local file in the hub's format), ``repeat`` copies of the set."""

    def __init__(
        self, variant: AIMEVariant = "2024", repeat: int = 16, data_path: str | Path | None = None, **kwargs: Any
    ) -> None:
        if variant != "2024":
            raise DataError(f"variant: not supported yet: AIME {variant!r}; AIME '2024' is shipped")
        if repeat < 1:
            raise DataError(f"repeat: must be at least 1, got {repeat}")
        self.task_name = f"AIME{variant}"
        self.val_dataset = None
        rows = self.load_formatted(HUB_ID, HUB_SPLIT, data_path)
        self.dataset = datasets.concatenate_datasets([rows] * repeat)

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "messages": [
                {"role": "user", "content": data["problem"]},
                {"role": "assistant", "content": data["answer"]},
            ],
            "task_name": self.task_name,
        }

"""NeMo-RL's ``DAPOMath17KDataset`` (``BytedTsinghua-SIA/DAPO-Math-17k``) and ``DAPOMathAIME2024Dataset``
(``BytedTsinghua-SIA/AIME-2024``, the same row format): user = the first prompt message's content, assistant =
``reward_model.ground_truth``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.raw_dataset import RawDataset


class DAPOMath17KDataset(RawDataset):
    """The hub's train rows (``data_path``: a local file in its format)."""

    task_name = "DAPOMath17K"
    hub_id = "BytedTsinghua-SIA/DAPO-Math-17k"

    def __init__(self, data_path: str | Path | None = None, **kwargs: Any) -> None:
        self.val_dataset = None
        self.dataset = self.load_formatted(self.hub_id, "train", data_path)

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "messages": [
                {"role": "user", "content": data["prompt"][0]["content"]},
                {"role": "assistant", "content": data["reward_model"]["ground_truth"]},
            ],
            "task_name": self.task_name,
        }


class DAPOMathAIME2024Dataset(DAPOMath17KDataset):
    """AIME 2024 in DAPO's row format (the hub's train rows, or ``data_path``)."""

    task_name = "DAPOMathAIME2024"
    hub_id = "BytedTsinghua-SIA/AIME-2024"

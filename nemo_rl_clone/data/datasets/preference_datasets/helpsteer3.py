"""NeMo-RL's preference form of HelpSteer3 (``nvidia/HelpSteer3``, subset ``preference``): ``overall_preference``
< 0 prefers response 1, > 0 response 2; a tie (0) makes both sides response 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.preference_datasets.binary_preference_dataset import ranked_pair
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset
from nemo_rl_clone.data.datasets.response_datasets.helpsteer3 import context_messages


class HelpSteer3Dataset(RawDataset):
    """The hub's ``split`` rows (``data_path``: a local file in its format) as ranked pairs."""

    def __init__(self, split: str = "train", data_path: str | Path | None = None, **kwargs: Any):
        self.task_name = "HelpSteer3"
        self.val_dataset = None
        self.dataset = self.load_formatted("nvidia/HelpSteer3", split, data_path, subset="preference")

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        first, second, preference = data["response1"], data["response2"], data["overall_preference"]
        if preference > 0:
            chosen, rejected = second, first
        elif preference < 0:
            chosen, rejected = first, second
        else:  # a tie: neither is known to be better
            chosen, rejected = first, first
        return ranked_pair(context_messages(data["context"]), chosen, rejected, self.task_name)

"""NeMo-RL's response form of HelpSteer3 (``nvidia/HelpSteer3``, subset ``preference``): the context as messages and
the preferred response (response 1 when ``overall_preference`` ≤ 0, else response 2) as the one to learn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.raw_dataset import RawDataset


def context_messages(context: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """HelpSteer3's ``context``: text is one user message; a conversation is kept as it is."""
    return [{"role": "user", "content": context}] if isinstance(context, str) else context


class HelpSteer3Dataset(RawDataset):
    """The hub's ``split`` rows (``data_path``: a local file in its format) as ``context`` / ``response``."""

    def __init__(self, split: str = "train", data_path: str | Path | None = None, **kwargs: Any) -> None:
        self.task_name = "HelpSteer3"
        self.val_dataset = None
        self.dataset = self.load_formatted("nvidia/HelpSteer3", split, data_path, subset="preference")

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        # A tie (0) keeps response 1: neither is known to be better.
        chosen = data["response2"] if data["overall_preference"] > 0 else data["response1"]
        return {
            "context": context_messages(data["context"]),
            "response": [{"role": "assistant", "content": chosen}],
            "task_name": self.task_name,
        }

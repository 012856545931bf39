"""NeMo-RL's ``Tulu3PreferenceDataset`` (``allenai/llama-3.1-tulu-3-8b-preference-mixture``): two conversations
that share all but their last (assistant) message; the shared part is the context."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.preference_datasets.binary_preference_dataset import ranked_pair
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset


class Tulu3PreferenceDataset(RawDataset):
    """The hub's train rows (``data_path``: a local file in its format) as ranked pairs."""

    def __init__(self, data_path: str | Path | None = None, **kwargs: Any):
        self.task_name = "Tulu3Preference"
        self.val_dataset = None
        self.dataset = self.load_formatted("allenai/llama-3.1-tulu-3-8b-preference-mixture", "train", data_path)

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        chosen, rejected = data["chosen"], data["rejected"]
        context = chosen[:-1]
        if json.dumps(context, ensure_ascii=False) != json.dumps(rejected[:-1], ensure_ascii=False):
            raise DataError(f"Tulu3Preference: chosen and rejected differ before their last message: {chosen}")
        for side, conversation in (("chosen", chosen), ("rejected", rejected)):
            if conversation[-1]["role"] != "assistant":
                raise DataError(f"Tulu3Preference: the last {side} message is not the assistant's: {conversation[-1]}")
        return ranked_pair(context, chosen[-1]["content"], rejected[-1]["content"], self.task_name)

"""NeMo-RL's ``OpenMathInstruct2Dataset`` (``nvidia/OpenMathInstruct-2``): user = ``problem``, assistant = the
``output_key`` column (``expected_answer`` for RL, ``generated_solution`` for SFT)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset

SPLITS = ("train", "train_1M", "train_2M", "train_5M")


class OpenMathInstruct2Dataset(RawDataset):
    """The hub's ``split`` (``data_path``: a local file in its format), ``split_validation_size`` of it held out
    with ``seed``."""

    def __init__(
        self,
        output_key: str = "expected_answer",
        split: str = "train_1M",
        split_validation_size: float = 0.05,
        seed: int = 42,
        data_path: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        if split not in SPLITS:
            raise DataError(f"data.split: {split!r} is not an OpenMathInstruct-2 split; use one of {list(SPLITS)}")
        self.input_key = "problem"
        self.output_key = output_key
        self.task_name = "OpenMathInstruct-2"
        self.dataset = self.load_formatted("nvidia/OpenMathInstruct-2", split, data_path)
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

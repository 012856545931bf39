"""NeMo-RL's ``GSM8KDataset`` (``openai/gsm8k``, subset ``main``): user = ``question``, assistant = the text after
``####`` in ``answer`` (``extract_answer``), else the whole worked answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.raw_dataset import RawDataset


def final_answer(solution: str) -> str | None:
    """The text after ``####`` (stripped), or None when the solution has no ``####``."""
    return solution.split("####")[1].strip() if "####" in solution else None


class GSM8KDataset(RawDataset):
    """The hub's ``split`` rows (``data_path``: a local file in its format)."""

    def __init__(
        self,
        split: str = "train",
        extract_answer: bool = True,
        system_prompt_file: str | None = None,
        data_path: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        self.task_name = "gsm8k"
        self.extract_answer = extract_answer
        self.val_dataset = None
        self.dataset = self.load_formatted("openai/gsm8k", split, data_path, subset="main")

    def format_data(self, data: dict[str, Any]) -> dict[str, Any]:
        answer = final_answer(data["answer"]) if self.extract_answer else data["answer"]
        return {
            "messages": [
                {"role": "user", "content": data["question"]},
                {"role": "assistant", "content": answer},
            ],
            "task_name": self.task_name,
        }

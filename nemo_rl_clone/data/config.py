"""Data config (``data``): NeMo-RL's keys, typed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class DataConfig:
    dataset_name: str = "OpenMathInstruct-2"
    prompt_file: Optional[str] = "examples/prompts/cot.txt"
    system_prompt_file: Optional[str] = None
    max_input_seq_length: int = 512
    shuffle: bool = True
    num_workers: int = 1

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if self.max_input_seq_length < 1:
            problems.append(("max_input_seq_length", f"must be >= 1, got {self.max_input_seq_length}"))
        if self.num_workers < 0:
            problems.append(("num_workers", f"must be >= 0, got {self.num_workers}"))
        return problems

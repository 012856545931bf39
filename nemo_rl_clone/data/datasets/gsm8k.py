"""GSM8K (``openai/gsm8k``, subset ``main``): columns ``question`` and ``answer``, a worked solution ending in
``#### <final answer>``. The gold answer is the text after ``####``; training rows are the ``train`` split,
validation rows the ``test`` split (NeMo-RL's GDPO recipe), or local files in the same format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.data.datasets.common import Field, LoadedDataset, column, load_raw_rows, to_common_math_form

NAME = "gsm8k"
HUB_ID = "openai/gsm8k"
HUB_SUBSET = "main"


def load_gsm8k(data_path: str | None = None, val_data_path: str | None = None) -> LoadedDataset:
    """Train rows from ``data_path`` (else the hub's train split), validation rows from ``val_data_path`` (else the
    hub's test split)."""
    return LoadedDataset(name=NAME, train=_load(data_path, "train"), validation=_load(val_data_path, "test"))


def _final_answer(row: Mapping[str, Any]) -> str:
    solution = row["answer"]
    if "####" not in solution:
        raise KeyError("####")  # read as a missing field: the error names the row
    return solution.split("####")[1].strip()


def _load(data_path: str | None, split: str):
    raw = load_raw_rows(NAME, HUB_ID, split, data_path, hub_subset=HUB_SUBSET)
    answer = Field(source="answer (after ####)", column="answer", get=_final_answer)
    return to_common_math_form(raw, f"{NAME} ({data_path or HUB_ID})", problem=column("question"), answer=answer)

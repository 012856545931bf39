"""DAPO-Math-17k (``BytedTsinghua-SIA/DAPO-Math-17k``): verl-style rows with ``prompt`` (a chat list whose user
message holds the problem, already wrapped in DAPO's own answer-format instructions) and ``reward_model``
(``{"ground_truth", "style"}``). Validation is AIME 2024, as in NeMo-RL.

The hub file repeats each of its ~17.9k problems many times; rows are kept as they are (repeats act as epochs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.data.datasets.aime2024 import with_aime2024_validation
from nemo_rl_clone.data.datasets.common import Field, LoadedDataset, load_raw_rows, to_common_math_form

NAME = "DAPOMath17K"
HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"
HUB_SPLIT = "train"


def _user_content(row: Mapping[str, Any]) -> Any:
    return next((message["content"] for message in row["prompt"] if message["role"] == "user"), None)


PROBLEM = Field(source="prompt[role=user].content", column="prompt", get=_user_content)
ANSWER = Field(
    source="reward_model.ground_truth", column="reward_model", get=lambda row: row["reward_model"]["ground_truth"]
)


def load_dapo_math(
    data_path: str | None = None,
    val_data_path: str | None = None,
    split_validation_size: float | None = None,
    seed: int = 42,
) -> LoadedDataset:
    """Load DAPO-Math-17k in the common form (arguments as in :func:`load_deepscaler`)."""
    raw = load_raw_rows(NAME, HUB_ID, HUB_SPLIT, data_path)
    train = to_common_math_form(raw, f"{NAME} ({data_path or HUB_ID})", problem=PROBLEM, answer=ANSWER)
    return with_aime2024_validation(NAME, train, val_data_path, split_validation_size, seed)

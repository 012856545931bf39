"""DeepScaleR (``agentica-org/DeepScaleR-Preview-Dataset``, ~40k problems): columns ``problem``, ``answer``,
``solution``. Validation is AIME 2024, as in NeMo-RL."""

from __future__ import annotations

from nemo_rl_clone.data.datasets.aime2024 import with_aime2024_validation
from nemo_rl_clone.data.datasets.common import LoadedDataset, column, load_raw_rows, to_common_math_form

NAME = "DeepScaler"
HUB_ID = "agentica-org/DeepScaleR-Preview-Dataset"
HUB_SPLIT = "train"


def load_deepscaler(
    data_path: str | None = None,
    val_data_path: str | None = None,
    split_validation_size: float | None = None,
    seed: int = 42,
) -> LoadedDataset:
    """Load DeepScaleR in the common form.

    Args:
        data_path: local file in the hub format instead of the hub.
        val_data_path: local validation file in the AIME 2024 format (``problem``, ``answer``) instead of the hub.
        split_validation_size: if > 0, validate on this seeded fraction of the training rows instead of AIME 2024.
        seed: seed of that split.
    """
    raw = load_raw_rows(NAME, HUB_ID, HUB_SPLIT, data_path)
    train = to_common_math_form(
        raw, f"{NAME} ({data_path or HUB_ID})", problem=column("problem"), answer=column("answer")
    )
    return with_aime2024_validation(NAME, train, val_data_path, split_validation_size, seed)

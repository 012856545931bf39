"""AIME 2024 (``HuggingFaceH4/aime_2024``, 30 problems): columns ``id``, ``problem``, ``solution``, ``answer``,
``url``, ``year``. An evaluation set: rows are returned as ``validation``."""

from __future__ import annotations

import datasets

from nemo_rl_clone.data.datasets.common import (
    LoadedDataset,
    column,
    load_raw_rows,
    split_train_validation,
    to_common_math_form,
    validation_source,
)

NAME = "aime2024"
HUB_ID = "HuggingFaceH4/aime_2024"
HUB_SPLIT = "train"


def load_aime2024(data_path: str | None = None) -> LoadedDataset:
    """Load AIME 2024 in the common form (from the hub, or ``data_path``: a local file in the hub format)."""
    return LoadedDataset(name=NAME, train=None, validation=aime2024_rows(data_path))


def aime2024_rows(data_path: str | None = None) -> datasets.Dataset:
    """AIME 2024 rows; also the default validation set of DeepScaleR and DAPO-Math-17k."""
    raw = load_raw_rows(NAME, HUB_ID, HUB_SPLIT, data_path)
    return to_common_math_form(
        raw, f"{NAME} ({data_path or HUB_ID})", problem=column("problem"), answer=column("answer")
    )


def with_aime2024_validation(
    name: str,
    train_rows: datasets.Dataset,
    val_data_path: str | None,
    split_validation_size: float | None,
    seed: int,
) -> LoadedDataset:
    """Training rows plus validation as NeMo-RL does for DeepScaleR / DAPO-Math-17k: AIME 2024 (from the hub, or
    ``val_data_path`` in its format), or a seeded hold-out of the training rows when ``split_validation_size > 0``.
    """
    val_path, split_size = validation_source(val_data_path, split_validation_size, 0.0, name)
    train, validation = split_train_validation(train_rows, split_size, seed, name)
    if validation is None:
        validation = aime2024_rows(val_path)
    return LoadedDataset(name=name, train=train, validation=validation)

"""OpenMathInstruct-2 (``nvidia/OpenMathInstruct-2``): columns ``problem``, ``generated_solution``,
``expected_answer``, ``problem_source``. RL uses ``problem`` and ``expected_answer``; validation is a seeded random
hold-out of the training split unless a separate validation file is given."""

from __future__ import annotations

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import (
    LoadedDataset,
    column,
    load_raw_rows,
    split_train_validation,
    to_common_math_form,
    validation_source,
)

NAME = "OpenMathInstruct-2"
HUB_ID = "nvidia/OpenMathInstruct-2"
HUB_SPLITS = ("train", "train_1M", "train_2M", "train_5M")
DEFAULT_SPLIT_VALIDATION_SIZE = 0.05


def load_openmathinstruct2(
    data_path: str | None = None,
    val_data_path: str | None = None,
    split: str = "train_1M",
    split_validation_size: float | None = None,
    seed: int = 42,
) -> LoadedDataset:
    """Load OpenMathInstruct-2 in the common form.

    Args:
        data_path: local file in the hub format instead of the hub (then ``split`` is not used).
        val_data_path: local validation file in the same format; replaces the hold-out split.
        split: hub split, one of :data:`HUB_SPLITS`.
        split_validation_size: fraction of the training rows held out for validation (default 0.05; 0 for none).
        seed: seed of the hold-out split.
    """
    if data_path is None and split not in HUB_SPLITS:
        raise DataError(f"{NAME}: unknown split {split!r}; the hub dataset has {list(HUB_SPLITS)}")
    val_path, split_size = validation_source(val_data_path, split_validation_size, DEFAULT_SPLIT_VALIDATION_SIZE, NAME)
    rows = _load(data_path, split)
    train, validation = split_train_validation(rows, split_size, seed, NAME)
    if val_path is not None:
        validation = _load(val_path, split)
    return LoadedDataset(name=NAME, train=train, validation=validation)


def _load(data_path: str | None, split: str):
    source = f"{NAME} ({data_path or HUB_ID})"
    raw = load_raw_rows(NAME, HUB_ID, split, data_path)
    return to_common_math_form(raw, source, problem=column("problem"), answer=column("expected_answer"))

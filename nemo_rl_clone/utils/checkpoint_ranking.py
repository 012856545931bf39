"""Which checkpoints are best: the ``checkpointing.metric_name`` value each one saved, and the order that
``keep_top_k`` keeps them in."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def raw_metric(training_info: Mapping[str, Any], metric_name: str) -> Any:
    """``training_info[metric_name]``, else the nested ``training_info[prefix][name]``; None when absent."""
    if metric_name in training_info:
        return training_info[metric_name]
    prefix, _, name = metric_name.partition(":")
    section = training_info.get(prefix)
    return section.get(name) if isinstance(section, Mapping) else None


def is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def get_metric(training_info: Mapping[str, Any], metric_name: str) -> float | None:
    """The value of ``metric_name`` in ``training_info``, or None if it is absent or not a finite number.

    ``"val:accuracy"`` reads the flat key ``training_info["val:accuracy"]`` when it exists, else the nested
    ``training_info["val"]["accuracy"]``.
    """
    value = raw_metric(training_info, metric_name)
    return float(value) if is_number(value) and math.isfinite(value) else None


def check_rankable_metric(training_info: Mapping[str, Any], metric_name: str | None) -> None:
    """Fail early on a metric that exists but cannot be ranked (a caller bug, not a missing value)."""
    if metric_name is None:
        return
    value = raw_metric(training_info, metric_name)
    if value is not None and not is_number(value):
        raise TypeError(
            f"training_info[{metric_name!r}] must be a number (it ranks checkpoints for keep_top_k), "
            f"got {type(value).__name__} {value!r}"
        )


def rank_best_first(
    checkpoints: list[tuple[int, Path]],
    metric_name: str | None,
    higher_is_better: bool,
    load_training_info: Callable[[Path], Mapping[str, Any]],
) -> tuple[list[tuple[int, Path]], list[str]]:
    """``(checkpoints best first, names of those without a finite metric)``.

    Without ``metric_name`` the latest comes first; otherwise by the metric, ties by the later step, and those
    lacking it last.
    """
    if metric_name is None:
        return checkpoints[::-1], []
    sign = 1.0 if higher_is_better else -1.0
    keyed, missing = [], []
    for step, path in checkpoints:
        value = get_metric(load_training_info(path), metric_name)
        if value is None:
            missing.append(path.name)
        keyed.append(((value is not None, sign * value if value is not None else 0.0, step), step, path))
    keyed.sort(key=lambda item: item[0], reverse=True)
    return [(step, path) for _, step, path in keyed], missing

"""Reward-model validation in NeMo-RL v0.7.0's form (`nemo_rl_clone.algorithms.supervised.nemo_rl_validation`):
``validate``, ``validate_one_dataset`` and ``RMValMetrics``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_rl_clone.algorithms.rm.config import RMAlgorithm
from nemo_rl_clone.algorithms.supervised import nemo_rl_validation as validation


@dataclass
class RMValMetrics:
    """One validation set's metrics: sample-weighted means over its batches, and the summed sample count."""

    loss: float
    accuracy: float
    rewards_chosen_mean: float
    rewards_rejected_mean: float
    num_valid_samples: float


def validate_one_dataset(
    policy: Any,
    val_dataloader: Any,
    loss_fn: Any,
    step: int,
    master_config: Any,
    val_batches: int,
    val_batch_size: int,
    val_mbs: int,
    dataset_name: str,
) -> tuple[RMValMetrics, dict[str, float]] | None:
    """``(RMValMetrics, {"total_validation_time": s})`` of one validation set (None without a dataloader): its
    first ``val_batches`` batches (all when ≤ 0) in eval mode, ``val_mbs`` pairs per micro-batch."""
    algorithm = RMAlgorithm(loss_fn)
    return validation.validate_one_dataset(algorithm, RMValMetrics, policy, val_dataloader, val_batches, val_mbs)


def validate(
    policy: Any,
    val_dataloader: Any,
    tokenizer: Any,
    loss_fn: Any,
    step: int,
    master_config: Any,
    val_batches: int,
    val_batch_size: int,
    val_mbs: int,
    logger: Any,
) -> tuple[dict[str, float], dict[str, float]]:
    """Every named validation set of ``val_dataloader`` (a dict, or one dataloader named ``validation``), each
    logged under ``validation-<name>``: ``({"validation-<name>_<metric>": value}, timings)``."""

    def one_dataset(loader: Any, name: str) -> tuple[RMValMetrics, dict[str, float]] | None:
        parts = (step, master_config, val_batches, val_batch_size, val_mbs, name)
        return validate_one_dataset(policy, loader, loss_fn, *parts)

    return validation.validate_datasets(one_dataset, RMValMetrics, val_dataloader, step, logger)

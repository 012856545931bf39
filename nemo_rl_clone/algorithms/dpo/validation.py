"""DPO's validation in NeMo-RL v0.7.0's form (`nemo_rl_clone.algorithms.supervised.nemo_rl_validation`):
``validate``, ``validate_one_dataset``, ``add_ref_logprobs_to_data`` and ``DPOValMetrics``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nemo_rl_clone.algorithms.dpo.config import DPOAlgorithm
from nemo_rl_clone.algorithms.supervised import nemo_rl_validation as validation


@dataclass
class DPOValMetrics:
    """One validation set's metrics: sample-weighted means over its batches, and summed counts."""

    loss: float
    sft_loss: float
    preference_loss: float
    accuracy: float
    rewards_chosen_mean: float
    rewards_rejected_mean: float
    num_valid_samples: float
    global_valid_seqs: float
    global_valid_toks: float


def add_ref_logprobs_to_data(dataloader: Any, policy: Any, master_config: Any, is_val: bool = False) -> Iterator[Any]:
    """Each batch of ``dataloader`` with ``reference_policy_logprobs`` added (the frozen reference's, in this
    library's layout: position i scores token i, position 0 is 0; this library's `DPOLossFn` reads them so), the
    reference pass run in micro-batches of ``dpo.val_micro_batch_size`` (``is_val``) or
    ``policy.train_micro_batch_size`` pairs. A short batch is padded with masked rows, in validation only."""
    pairs = validation.config_value(master_config, "dpo", "val_micro_batch_size") if is_val else None
    if pairs is None:
        pairs = validation.config_value(master_config, "policy", "train_micro_batch_size")
    algorithm = DPOAlgorithm(None)  # type: ignore[arg-type]  # prepare_batch reads no loss
    yield from validation.prepared_batches(algorithm, dataloader, policy, 2 * pairs, pad=is_val)


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
) -> tuple[DPOValMetrics, dict[str, float]] | None:
    """``(DPOValMetrics, {"total_validation_time": s})`` of one validation set (None without a dataloader): its
    first ``val_batches`` batches (all when ≤ 0) in eval mode, ``val_mbs`` pairs per micro-batch."""
    algorithm = DPOAlgorithm(loss_fn)
    return validation.validate_one_dataset(algorithm, DPOValMetrics, policy, val_dataloader, val_batches, val_mbs)


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

    def one_dataset(loader: Any, name: str) -> tuple[DPOValMetrics, dict[str, float]] | None:
        parts = (step, master_config, val_batches, val_batch_size, val_mbs, name)
        return validate_one_dataset(policy, loader, loss_fn, *parts)

    return validation.validate_datasets(one_dataset, DPOValMetrics, val_dataloader, step, logger)

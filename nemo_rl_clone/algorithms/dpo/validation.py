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


validate_one_dataset, validate = validation.preference_validation(DPOAlgorithm, DPOValMetrics)

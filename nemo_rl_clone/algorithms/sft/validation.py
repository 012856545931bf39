"""SFT's validation in NeMo-RL v0.7.0's form (`nemo_rl_clone.algorithms.supervised.nemo_rl_validation`)."""

from __future__ import annotations

from typing import Any

from nemo_rl_clone.algorithms.sft.config import SFTAlgorithm
from nemo_rl_clone.algorithms.supervised import nemo_rl_validation as validation


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
) -> tuple[dict[str, float], dict[str, float]]:
    """``({"val_loss": ...}, {"total_validation_time": s})``: the loss over the first ``val_batches`` batches of
    ``val_dataloader`` (all when ≤ 0; batches as this library's SFT collate makes them), in eval mode, weighted by
    their valid tokens; ``({}, {})`` without a dataloader."""
    return validation.sft_validate(SFTAlgorithm(loss_fn), policy, val_dataloader, val_batches, val_mbs)

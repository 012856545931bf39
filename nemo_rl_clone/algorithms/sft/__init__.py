"""Supervised fine-tuning: NLL on the assistant tokens of chat rows, through the shared `supervised.loop`.

    setup(config) -> SupervisedRun;  sft_train(run)

Metrics: ``train/{loss, grad_norm, lr, num_valid_samples, num_unmasked_tokens}``, ``validation/val_loss``,
``timing/train/*``.

`config` holds what the checks read, `train` the run; the names below load lazily from either."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.sft.config import SFTAlgorithm, SFTConfig, SFTMasterConfig
    from nemo_rl_clone.algorithms.sft.train import (
        ALGORITHM,
        SFT,
        MasterConfig,
        SFTSaveState,
        setup,
        sft_datasets,
        sft_train,
    )
    from nemo_rl_clone.algorithms.sft.validation import validate

_WHERE = {
    "validate": "validation",
    "SFTConfig": "config",
    "SFTMasterConfig": "config",
    "SFTAlgorithm": "config",
    "setup": "train",
    "sft_train": "train",
    "SFT": "train",
    "ALGORITHM": "train",
    "MasterConfig": "train",
    "SFTSaveState": "train",
    "sft_datasets": "train",
}
__all__ = [
    "ALGORITHM",
    "SFT",
    "MasterConfig",
    "SFTAlgorithm",
    "SFTConfig",
    "SFTMasterConfig",
    "SFTSaveState",
    "setup",
    "sft_datasets",
    "sft_train",
    "validate",
]


__getattr__ = lazy_getattr(__name__, _WHERE)

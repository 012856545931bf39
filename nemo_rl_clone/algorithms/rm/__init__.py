"""Reward-model training: a scalar-head model (``policy.reward_model_cfg.enabled``) fitted Bradley-Terry
(`PreferenceLossFn`) on preference pairs, through the shared `supervised.loop`.

    setup(config) -> SupervisedRun;  rm_train(run)

Batch sizes count pairs, as in DPO (``policy.train_global_batch_size: 8`` = 16 rows). Metrics: ``train/{loss,
accuracy, rewards_chosen_mean, rewards_rejected_mean, reward_margin, grad_norm, lr, num_valid_samples}`` (rewards are
the head's scores), ``validation/{loss, accuracy, ...}`` (accuracy = fraction of validation pairs scored chosen >
rejected), ``timing/train/*``.

`config` holds what the checks read, `train` the run; the names below load lazily from either."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.rm.config import RMAlgorithm, RMConfig, RMMasterConfig
    from nemo_rl_clone.algorithms.rm.train import ALGORITHM, RM, MasterConfig, RMSaveState, rm_train, setup
    from nemo_rl_clone.algorithms.rm.validation import RMValMetrics, validate, validate_one_dataset

_WHERE = {
    "RMValMetrics": "validation",
    "validate": "validation",
    "validate_one_dataset": "validation",
    "RMConfig": "config",
    "RMMasterConfig": "config",
    "RMAlgorithm": "config",
    "setup": "train",
    "rm_train": "train",
    "RM": "train",
    "ALGORITHM": "train",
    "MasterConfig": "train",
    "RMSaveState": "train",
}
__all__ = [
    "ALGORITHM",
    "RM",
    "MasterConfig",
    "RMAlgorithm",
    "RMConfig",
    "RMMasterConfig",
    "RMSaveState",
    "RMValMetrics",
    "rm_train",
    "setup",
    "validate",
    "validate_one_dataset",
]


__getattr__ = lazy_getattr(__name__, _WHERE)

"""Direct Preference Optimization (`DPOLossFn`) against the frozen initial policy, through the shared
`supervised.loop`.

    setup(config) -> SupervisedRun;  dpo_train(run)

Batch sizes count preference *pairs* (NeMo-RL's convention): ``policy.train_global_batch_size: 8`` is 8 pairs, i.e.
16 rows (chosen, rejected interleaved) per optimizer step; ``policy.train_micro_batch_size`` and
``dpo.val_{global,micro}_batch_size`` likewise. Metrics: ``train/{loss, sft_loss, preference_loss, accuracy,
rewards_chosen_mean, rewards_rejected_mean, reward_margin, grad_norm, lr, num_valid_samples}`` (rewards are the
summed policy − reference logprobs of a response, without β), the same under ``validation/`` (no grad_norm/lr),
``timing/train/*``.

`config` holds what the checks read, `train` the run; the names below load lazily from either."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.dpo.config import DPOAlgorithm, DPOConfig, DPOMasterConfig
    from nemo_rl_clone.algorithms.dpo.train import ALGORITHM, DPO, DPOSaveState, MasterConfig, dpo_train, setup
    from nemo_rl_clone.algorithms.dpo.validation import (
        DPOValMetrics,
        add_ref_logprobs_to_data,
        validate,
        validate_one_dataset,
    )

_WHERE = {
    "DPOValMetrics": "validation",
    "add_ref_logprobs_to_data": "validation",
    "validate": "validation",
    "validate_one_dataset": "validation",
    "DPOConfig": "config",
    "DPOMasterConfig": "config",
    "DPOAlgorithm": "config",
    "setup": "train",
    "dpo_train": "train",
    "DPO": "train",
    "ALGORITHM": "train",
    "MasterConfig": "train",
    "DPOSaveState": "train",
}
__all__ = [
    "ALGORITHM",
    "DPO",
    "DPOAlgorithm",
    "DPOConfig",
    "DPOMasterConfig",
    "DPOSaveState",
    "DPOValMetrics",
    "MasterConfig",
    "add_ref_logprobs_to_data",
    "dpo_train",
    "setup",
    "validate",
    "validate_one_dataset",
]


__getattr__ = lazy_getattr(__name__, _WHERE)

"""GRPO (docs/grpo.md): the step loop in `train`, its config (`config`), building its run (`components`) and its
advantages (`advantages`); the rollout machinery it shares with async GRPO, PPO and distillation is
`nemo_rl_clone.rollout`. NeMo-RL's names, from the package as from NeMo-RL's module:
``from nemo_rl_clone.algorithms.grpo import MasterConfig, setup, grpo_train, async_grpo_train``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.grpo.nemo_rl_api import async_grpo_train, grpo_train, setup
    from nemo_rl_clone.algorithms.grpo.nemo_rl_batches import (
        add_grpo_token_loss_masks_and_generation_logprobs,
        aggregate_rollout_metrics,
        compute_and_apply_seq_logprob_error_masking,
        dynamic_sampling,
        extract_initial_prompt_messages,
        scale_rewards,
    )
    from nemo_rl_clone.algorithms.grpo.nemo_rl_helpers import (
        AdvEstimatorConfig,
        AsyncGRPOConfig,
        ColocatablePolicyInterface,
        EnvironmentInterface,
        GenerationInterface,
        GRPOLoggerConfig,
        Logger,
        RewardScalingConfig,
        StatefulDataLoader,
        TokenizerType,
        refit_policy_generation,
    )
    from nemo_rl_clone.algorithms.grpo.nemo_rl_helpers import _should_use_nemo_gym as _should_use_nemo_gym
    from nemo_rl_clone.algorithms.grpo.train import GRPOConfig, GRPOSaveState, MasterConfig, validate

__all__ = [
    "AdvEstimatorConfig",
    "AsyncGRPOConfig",
    "ColocatablePolicyInterface",
    "EnvironmentInterface",
    "GRPOConfig",
    "GRPOLoggerConfig",
    "GRPOSaveState",
    "GenerationInterface",
    "Logger",
    "MasterConfig",
    "RewardScalingConfig",
    "StatefulDataLoader",
    "TokenizerType",
    "add_grpo_token_loss_masks_and_generation_logprobs",
    "aggregate_rollout_metrics",
    "async_grpo_train",
    "compute_and_apply_seq_logprob_error_masking",
    "dynamic_sampling",
    "extract_initial_prompt_messages",
    "grpo_train",
    "refit_policy_generation",
    "scale_rewards",
    "setup",
    "validate",
]

# torch and the training code load when a name is first used (`utils.lazy_exports`). `setup` and the train functions
# take this library's one-argument forms and NeMo-RL's (`nemo_rl_api`); NeMo-RL's other names of its grpo module
# (the types its functions are annotated with, its config sections, two helpers) are `nemo_rl_helpers`', its batch
# helpers `nemo_rl_batches`'.
_NEMO_RL_FORMS = ("async_grpo_train", "grpo_train", "setup")
_TRAIN = ("GRPOConfig", "GRPOSaveState", "MasterConfig", "validate")
_BATCHES = (
    "add_grpo_token_loss_masks_and_generation_logprobs",
    "aggregate_rollout_metrics",
    "compute_and_apply_seq_logprob_error_masking",
    "dynamic_sampling",
    "extract_initial_prompt_messages",
    "scale_rewards",
)


def _submodule(name: str) -> str:
    if name in _TRAIN:
        return "train"
    if name in _NEMO_RL_FORMS:
        return "nemo_rl_api"
    return "nemo_rl_batches" if name in _BATCHES else "nemo_rl_helpers"


__getattr__ = lazy_getattr(__name__, {name: _submodule(name) for name in (*__all__, "_should_use_nemo_gym")})

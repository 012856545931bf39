"""GRPO (docs/grpo.md): the step loop in `train`, its config (`config`), building its run (`components`) and its
advantages (`advantages`); the rollout machinery it shares with async GRPO, PPO and distillation is
`nemo_rl_clone.rollout`. NeMo-RL's names, from the package as from NeMo-RL's module:
``from nemo_rl_clone.algorithms.grpo import MasterConfig, setup, grpo_train, async_grpo_train``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.grpo.nemo_rl_api import async_grpo_train, grpo_train, setup
    from nemo_rl_clone.algorithms.grpo.nemo_rl_helpers import (
        ColocatablePolicyInterface,
        EnvironmentInterface,
        GenerationInterface,
        Logger,
        StatefulDataLoader,
        TokenizerType,
        refit_policy_generation,
    )
    from nemo_rl_clone.algorithms.grpo.nemo_rl_helpers import _should_use_nemo_gym as _should_use_nemo_gym
    from nemo_rl_clone.algorithms.grpo.train import GRPOConfig, GRPOSaveState, MasterConfig, validate

__all__ = [
    "ColocatablePolicyInterface",
    "EnvironmentInterface",
    "GRPOConfig",
    "GRPOSaveState",
    "GenerationInterface",
    "Logger",
    "MasterConfig",
    "StatefulDataLoader",
    "TokenizerType",
    "async_grpo_train",
    "grpo_train",
    "refit_policy_generation",
    "setup",
    "validate",
]

# torch and the training code load when a name is first used (`utils.lazy_exports`). `setup` and the train functions
# take this library's one-argument forms and NeMo-RL's (`nemo_rl_api`); NeMo-RL's other names of its grpo module
# (the types its functions are annotated with, two helpers) are `nemo_rl_helpers`'.
_NEMO_RL_FORMS = ("async_grpo_train", "grpo_train", "setup")
_TRAIN = ("GRPOConfig", "GRPOSaveState", "MasterConfig", "validate")
__getattr__ = lazy_getattr(
    __name__,
    {
        name: "train" if name in _TRAIN else "nemo_rl_api" if name in _NEMO_RL_FORMS else "nemo_rl_helpers"
        for name in (*__all__, "_should_use_nemo_gym")
    },
)

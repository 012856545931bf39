"""GRPO (docs/grpo.md): the step loop in `train`, its config (`config`), building its run (`components`) and its
advantages (`advantages`); the rollout machinery it shares with async GRPO, PPO and distillation is
`nemo_rl_clone.rollout`. NeMo-RL's names, from the package as from NeMo-RL's module:
``from nemo_rl_clone.algorithms.grpo import MasterConfig, setup, grpo_train, async_grpo_train``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.grpo.nemo_rl_api import async_grpo_train, grpo_train, setup
    from nemo_rl_clone.algorithms.grpo.train import GRPOConfig, GRPOSaveState, MasterConfig, validate

__all__ = ["GRPOConfig", "GRPOSaveState", "MasterConfig", "async_grpo_train", "grpo_train", "setup", "validate"]


# torch and the training code load when a name is first used (`utils.lazy_exports`). `setup` and the train functions
# take this library's one-argument forms and NeMo-RL's (`nemo_rl_api`).
_NEMO_RL_FORMS = ("async_grpo_train", "grpo_train", "setup")
__getattr__ = lazy_getattr(__name__, {name: "nemo_rl_api" if name in _NEMO_RL_FORMS else "train" for name in __all__})

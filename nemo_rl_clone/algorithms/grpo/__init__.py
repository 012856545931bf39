"""GRPO (docs/grpo.md): the step loop in `train`, and beside it the machinery that async GRPO, on-policy
distillation and PPO share: `config`, `components` (building the run), `rollouts` / `async_rollouts`, `batches`,
`refit`, `monitors`, `repro` / `replay`. NeMo-RL's names, from the package as from NeMo-RL's module:
``from nemo_rl_clone.algorithms.grpo import MasterConfig, setup, grpo_train``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.grpo.train import (
        GRPOConfig,
        GRPOSaveState,
        MasterConfig,
        grpo_train,
        setup,
        validate,
    )

__all__ = ["GRPOConfig", "GRPOSaveState", "MasterConfig", "grpo_train", "setup", "validate"]


def __getattr__(name: str) -> Any:
    # The names load the training code (torch, transformers) on first use, so that importing the package for its
    # config alone stays light: an entry point validates the config before anything heavy loads.
    if name in __all__:
        from nemo_rl_clone.algorithms.grpo import train

        return getattr(train, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

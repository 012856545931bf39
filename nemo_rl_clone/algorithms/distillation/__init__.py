"""On-policy distillation (docs/distillation.md): the step loop in `train`, the whole-run schema in `config`.
NeMo-RL's names, from the package as from NeMo-RL's module:
``from nemo_rl_clone.algorithms.distillation import MasterConfig, setup, distillation_train``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.distillation.train import (
        DistillationComponents,
        DistillationConfig,
        DistillationMasterConfig,
        MasterConfig,
        check_vocab_equality,
        distillation_train,
        setup,
    )

__all__ = [
    "DistillationComponents",
    "DistillationConfig",
    "DistillationMasterConfig",
    "MasterConfig",
    "check_vocab_equality",
    "distillation_train",
    "setup",
]


def __getattr__(name: str) -> Any:
    # The names load the training code (torch, transformers) on first use, so that importing the package for its
    # config alone stays light: an entry point validates the config before anything heavy loads.
    if name in __all__:
        from nemo_rl_clone.algorithms.distillation import train

        return getattr(train, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

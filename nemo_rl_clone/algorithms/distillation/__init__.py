"""On-policy distillation (docs/distillation.md): the step loop in `train`, the whole-run schema in `config`.
NeMo-RL's names, from the package as from NeMo-RL's module:
``from nemo_rl_clone.algorithms.distillation import MasterConfig, setup, distillation_train``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

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


# torch and the training code load when a name is first used (`utils.lazy_exports`).
__getattr__ = lazy_getattr(__name__, dict.fromkeys(__all__, "train"))

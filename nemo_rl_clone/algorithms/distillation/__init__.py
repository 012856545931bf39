"""On-policy distillation (docs/distillation.md): the step loop in `train`, the whole-run schema in `config`.
NeMo-RL's names, from the package as from NeMo-RL's module:
``from nemo_rl_clone.algorithms.distillation import MasterConfig, setup, distillation_train``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.distillation.nemo_rl_api import (
        DistillationSaveState,
        TokenizerType,
        distillation_train,
        setup,
    )
    from nemo_rl_clone.algorithms.distillation.train import (
        DistillationComponents,
        DistillationConfig,
        DistillationMasterConfig,
        MasterConfig,
        check_vocab_equality,
    )

__all__ = [
    "DistillationComponents",
    "DistillationConfig",
    "DistillationMasterConfig",
    "DistillationSaveState",
    "MasterConfig",
    "TokenizerType",
    "check_vocab_equality",
    "distillation_train",
    "setup",
]


# torch and the training code load when a name is first used (`utils.lazy_exports`). `setup` and
# `distillation_train` take this library's one-argument forms and NeMo-RL's (`nemo_rl_api`).
_NEMO_RL_FORMS = ("DistillationSaveState", "TokenizerType", "distillation_train", "setup")
__getattr__ = lazy_getattr(__name__, {name: "nemo_rl_api" if name in _NEMO_RL_FORMS else "train" for name in __all__})

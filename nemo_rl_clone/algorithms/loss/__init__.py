"""Loss functions, at NeMo-RL v0.7.0's import path (``nemo_rl.algorithms.loss``): a v0.7.0 user's
``from nemo_rl.algorithms.loss import ClippedPGLossFn`` reads ``from nemo_rl_clone.algorithms.loss import
ClippedPGLossFn`` here. The call contract is in `loss_functions`."""

from nemo_rl_clone.algorithms.loss.loss_functions import (
    ClippedPGLossConfig,
    ClippedPGLossDataDict,
    ClippedPGLossFn,
    DistillationLossConfig,
    DistillationLossDataDict,
    DistillationLossFn,
    DPOLossConfig,
    DPOLossDataDict,
    DPOLossFn,
    LossType,
    NLLLossFn,
    PreferenceLossDataDict,
    PreferenceLossFn,
    calculate_kl,
)

__all__ = [
    "ClippedPGLossConfig",
    "ClippedPGLossDataDict",
    "ClippedPGLossFn",
    "DPOLossConfig",
    "DPOLossDataDict",
    "DPOLossFn",
    "DistillationLossConfig",
    "DistillationLossDataDict",
    "DistillationLossFn",
    "LossType",
    "NLLLossFn",
    "PreferenceLossDataDict",
    "PreferenceLossFn",
    "calculate_kl",
]

"""Loss functions, at NeMo-RL v0.7.0's import path (``nemo_rl.algorithms.loss``): a v0.7.0 user's
``from nemo_rl.algorithms.loss import ClippedPGLossFn`` reads ``from nemo_rl_clone.algorithms.loss import
ClippedPGLossFn`` here. The call contract is in `loss_functions`."""

from nemo_rl_clone.algorithms.loss import loss_functions
from nemo_rl_clone.algorithms.loss.loss_functions import *  # noqa: F403
from nemo_rl_clone.contract.loss_input import prepare_loss_input

__all__ = [*loss_functions.__all__, "prepare_loss_input"]

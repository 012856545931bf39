"""The earlier path of the losses, kept for one release: they live in `nemo_rl_clone.algorithms.loss` now
(NeMo-RL v0.7.0's layout). ``NLLLoss`` and ``PreferenceLoss`` are the earlier names of ``NLLLossFn`` and
``PreferenceLossFn``."""

from nemo_rl_clone.algorithms.loss import *  # noqa: F403
from nemo_rl_clone.algorithms.loss import NLLLossFn as NLLLoss  # noqa: F401
from nemo_rl_clone.algorithms.loss import PreferenceLossFn as PreferenceLoss  # noqa: F401

"""The earlier path of the distillation loss, kept for one release: `nemo_rl_clone.algorithms.loss.distillation`
now (``DistillationLossFn`` is also in `nemo_rl_clone.algorithms.loss`)."""

from nemo_rl_clone.algorithms.loss.distillation import *  # noqa: F403

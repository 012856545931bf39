"""The earlier path of the loss configs, kept for one release: `nemo_rl_clone.algorithms.loss.configs` now."""

from nemo_rl_clone.algorithms.loss.configs import *  # noqa: F403

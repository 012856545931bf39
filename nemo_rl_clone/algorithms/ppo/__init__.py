"""PPO with a critic: GAE, the clipped value loss and the ``ppo`` / ``value_loss_fn`` config sections. The policy's
loss is `nemo_rl_clone.algorithms.loss.ClippedPGLossFn` (section ``loss_fn``), as in GRPO."""

from nemo_rl_clone.algorithms.ppo.config import GAEConfig, MseValueLossConfig, PPOConfig
from nemo_rl_clone.algorithms.ppo.gae import (
    compute_advantages_and_returns,
    generalized_advantages,
    last_token_rewards,
    length_adaptive_lambda,
    whiten,
)
from nemo_rl_clone.algorithms.ppo.value_loss import MseValueLossFn, clipped_value_loss, explained_variance

__all__ = [
    "GAEConfig",
    "MseValueLossConfig",
    "MseValueLossFn",
    "PPOConfig",
    "clipped_value_loss",
    "compute_advantages_and_returns",
    "explained_variance",
    "generalized_advantages",
    "last_token_rewards",
    "length_adaptive_lambda",
    "whiten",
]

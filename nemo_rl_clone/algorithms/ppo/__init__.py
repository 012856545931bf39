"""PPO with a critic: GAE, the clipped value loss and the ``ppo`` / ``value_loss_fn`` config sections. The policy's
loss is `nemo_rl_clone.algorithms.loss.ClippedPGLossFn` (section ``loss_fn``), as in GRPO. NeMo-RL's entry points:
``from nemo_rl_clone.algorithms.ppo import MasterConfig, setup, ppo_train`` (`nemo_rl_api`; they load the training
code on first use); its other names (config sections, save state, ``dynamic_sampling``, ``validate``) are
`nemo_rl_helpers`'."""

from typing import TYPE_CHECKING

from nemo_rl_clone.algorithms.ppo.config import GAEConfig, MasterConfig, MseValueLossConfig, PPOConfig
from nemo_rl_clone.algorithms.ppo.gae import (
    compute_advantages_and_returns,
    generalized_advantages,
    last_token_rewards,
    length_adaptive_lambda,
    whiten,
)
from nemo_rl_clone.algorithms.ppo.value_loss import MseValueLossFn, clipped_value_loss, explained_variance
from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.ppo.nemo_rl_api import ppo_train, setup
    from nemo_rl_clone.algorithms.ppo.nemo_rl_helpers import (
        AdvEstimatorConfig,
        PPOLoggerConfig,
        PPOSaveState,
        TokenizerType,
        dynamic_sampling,
        validate,
    )

__all__ = [
    "AdvEstimatorConfig",
    "GAEConfig",
    "MasterConfig",
    "MseValueLossConfig",
    "MseValueLossFn",
    "PPOConfig",
    "PPOLoggerConfig",
    "PPOSaveState",
    "TokenizerType",
    "clipped_value_loss",
    "compute_advantages_and_returns",
    "dynamic_sampling",
    "explained_variance",
    "generalized_advantages",
    "last_token_rewards",
    "length_adaptive_lambda",
    "ppo_train",
    "setup",
    "validate",
    "whiten",
]

_HELPERS = ("AdvEstimatorConfig", "PPOLoggerConfig", "PPOSaveState", "TokenizerType", "dynamic_sampling", "validate")
__getattr__ = lazy_getattr(
    __name__, {"ppo_train": "nemo_rl_api", "setup": "nemo_rl_api", **dict.fromkeys(_HELPERS, "nemo_rl_helpers")}
)

"""NeMo-RL v0.7.0's path of the reward transformations (``nemo_rl.algorithms.reward_functions``); the code is
`nemo_rl_clone.rollout.rewards`, the ``reward_shaping`` section `nemo_rl_clone.rollout.config.RewardShapingConfig`.
A facade (`nemo_rl_clone.facades`): nothing inside the package imports it."""

from nemo_rl_clone.rollout.config import RewardShapingConfig
from nemo_rl_clone.rollout.rewards import (
    Tensor,
    accuracy_reward,
    apply_reward_shaping,
    overlong_penalty,
    process_rewards,
    response_length,
    scale_rewards,
)

__all__ = [
    "RewardShapingConfig",
    "Tensor",
    "accuracy_reward",
    "apply_reward_shaping",
    "overlong_penalty",
    "process_rewards",
    "response_length",
    "scale_rewards",
]

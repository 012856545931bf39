"""NeMo-RL v0.7.0's path of the reward transformations (``nemo_rl.algorithms.reward_functions``); the code is
`nemo_rl_clone.rollout.rewards`. A facade (`nemo_rl_clone.facades`): nothing inside the package imports it."""

from nemo_rl_clone.rollout.rewards import (
    accuracy_reward,
    overlong_penalty,
    process_rewards,
    response_length,
    scale_rewards,
)

__all__ = ["accuracy_reward", "overlong_penalty", "process_rewards", "response_length", "scale_rewards"]

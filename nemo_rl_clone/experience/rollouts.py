"""NeMo-RL v0.7.0's path of the multi-turn rollout (``nemo_rl.experience.rollouts``); the code is
`nemo_rl_clone.rollout.multi_turn`. A facade (`nemo_rl_clone.facades`): nothing inside the package imports it.
NeMo-RL's NeMo-Gym rollout names here stop with one line naming the feature (`refusing_getattr`)."""

from transformers import PreTrainedTokenizerBase as TokenizerType

from nemo_rl_clone.rollout.multi_turn import calculate_rewards, generate_responses, run_multi_turn_rollout
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

__all__ = ["TokenizerType", "calculate_rewards", "generate_responses", "run_multi_turn_rollout"]

__getattr__ = refusing_getattr(
    __name__,
    dict.fromkeys(
        ("run_async_nemo_gym_rollout", "AsyncNemoGymRolloutResult", "EffortLevelsConfig"), "NeMo-Gym environments"
    ),
)

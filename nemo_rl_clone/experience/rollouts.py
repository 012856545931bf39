"""NeMo-RL v0.7.0's path of the multi-turn rollout (``nemo_rl.experience.rollouts``); the code is
`nemo_rl_clone.rollout.multi_turn`. A facade (`nemo_rl_clone.facades`): nothing inside the package imports it."""

from nemo_rl_clone.rollout.multi_turn import run_multi_turn_rollout

__all__ = ["run_multi_turn_rollout"]

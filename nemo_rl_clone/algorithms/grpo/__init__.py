"""GRPO (docs/grpo.md): the step loop in `train`, and beside it the machinery that async GRPO, on-policy
distillation and PPO share: `config`, `components` (building the run), `rollouts` / `async_rollouts`, `batches`,
`refit`, `monitors`, `repro` / `replay`. NeMo-RL's names, from the package as from NeMo-RL's module:
``from nemo_rl_clone.algorithms.grpo import MasterConfig, setup, grpo_train``."""

from nemo_rl_clone.algorithms.grpo.train import GRPOConfig, GRPOSaveState, MasterConfig, grpo_train, setup, validate

__all__ = ["GRPOConfig", "GRPOSaveState", "MasterConfig", "grpo_train", "setup", "validate"]

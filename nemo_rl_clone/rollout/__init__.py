"""The rollout machinery every RL algorithm uses as an equal (GRPO, async GRPO, PPO, distillation): the loop section
of their configs (`config`), where a step's rollouts come from (`step_rollouts`, `async_rollouts`), the multi-turn and
agent rollouts themselves (`multi_turn`, `agent_rollouts`), rewards (`rewards`), the training batch (`batches`),
weight refit (`refit`), collapse monitors (`monitors`) and repro bundles (`repro`, `replay`).

A layer below `algorithms/`: it imports utils, distributed, contract, data, models and environments, never
algorithms."""

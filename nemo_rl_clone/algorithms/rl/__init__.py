"""GRPO's machinery, shared by async GRPO and on-policy distillation: config, setup, rollouts, batches, refit, monitors."""

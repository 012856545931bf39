"""nemo_rl_clone: Ray-orchestrated RL post-training for LLMs."""

"""NeMo-RL v0.7.0's package path ``nemo_rl.models.megatron``: here only its checkpoint converter, `community_import`.

This library's Megatron backend itself is `nemo_rl_clone.models.policy.megatron` (policy worker, model, export).
"""

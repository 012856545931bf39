"""NeMo-RL v0.7.0's generation backend names (``nemo_rl.models.generation.constants``): the values of
``policy.generation.backend``. Only vLLM (and ``hf``) generate here; the others are refused by name where the config
is validated."""

VLLM_BACKEND = "vllm"
SGLANG_BACKEND = "sglang"
MEGATRON_BACKEND = "megatron"

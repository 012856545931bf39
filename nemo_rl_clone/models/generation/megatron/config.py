"""NeMo-RL's typed view of the Megatron generation section (``policy.generation`` with ``backend: megatron``)."""

from __future__ import annotations

from typing import Any, TypedDict

from nemo_rl_clone.models.generation.config_types import GenerationConfig


class MCoreGenerationSpecificArgs(TypedDict, total=False):
    """``policy.generation.mcore_generation_config``: the settings of Megatron-Core's inference engine (KV-cache
    buffers, CUDA graphs, chunked prefill). Accepted and unused here: the policy's workers decode without that engine
    (`nemo_rl_clone.models.policy.workers.self_generation`)."""

    async_engine: bool
    expose_http_server: bool
    parsers: Any
    buffer_size_gb: float
    block_size_tokens: int
    max_tokens: int
    max_model_len: int
    num_cuda_graphs: int
    use_cuda_graphs_for_non_decode_steps: bool
    cuda_graph_impl: str
    inference_cuda_graph_scope: str
    materialize_only_last_token_logits: bool
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    refit_backend: str
    num_speculative_tokens: int
    mamba_inference_ssm_states_dtype: str
    mamba_inference_conv_states_dtype: str
    kv_cache_management_mode: str
    logging_step_interval: int


class MCoreGenerationConfig(GenerationConfig):
    mcore_generation_config: MCoreGenerationSpecificArgs

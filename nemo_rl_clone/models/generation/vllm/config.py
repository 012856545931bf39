"""NeMo-RL v0.7.0's ``VllmConfig``: the ``policy.generation`` section of a vLLM run as a dict, the form NeMo-RL's
scripts build in Python (``VllmConfig(backend="vllm", max_new_tokens=..., vllm_cfg={...})``) and read by key.

It only types the dict: the section is validated as this library's `GenerationConfig` where it is used
(`VllmGeneration`, `setup`), which names each unknown or refused key in one line. Note the name: this library's
own ``nemo_rl_clone.models.generation.config.VllmConfig`` is the ``vllm_cfg`` sub-section, typed as a dict by NeMo-RL's
`VllmSpecificArgs` below.
"""

from __future__ import annotations

from typing import Any, TypedDict


class VllmSpecificArgs(TypedDict, total=False):
    """The ``vllm_cfg`` sub-section as a dict (validated as `nemo_rl_clone.models.generation.config.VllmConfig`)."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    expert_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    skip_tokenizer_init: bool
    async_engine: bool
    load_format: str
    precision: str
    kv_cache_dtype: str
    enforce_eager: bool
    enable_return_routed_experts: bool
    use_tqdm: bool
    expose_http_server: bool
    http_server_serving_chat_kwargs: dict[str, Any] | None
    tool_parser_plugin: str | None
    env_vars: dict[str, str] | None
    reasoning_parser_plugin: str | None


class VllmConfig(TypedDict, total=False):
    backend: str
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int | None
    model_name: str
    stop_token_ids: list[int] | None
    stop_strings: list[str] | None
    colocated: dict[str, Any]
    port_range_low: int | None
    port_range_high: int | None
    use_async_rollouts: bool
    vllm_cfg: VllmSpecificArgs
    vllm_kwargs: dict[str, Any]
    quant_cfg: str | None
    real_quant: bool
    real_quant_ignore: list[str] | None

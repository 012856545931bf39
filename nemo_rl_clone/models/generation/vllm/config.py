"""NeMo-RL v0.7.0's ``VllmConfig``: the ``policy.generation`` section of a vLLM run as a dict, the form NeMo-RL's
scripts build in Python (``VllmConfig(backend="vllm", max_new_tokens=..., vllm_cfg={...})``) and read by key.

It only types the dict: the section is validated as this library's `GenerationConfig` where it is used
(`VllmGeneration`, `setup`), which names each unknown or refused key in one line. Note the name: this library's
own ``nemo_rl_clone.models.generation.config.VllmConfig`` is the ``vllm_cfg`` sub-section (NeMo-RL's
``VllmSpecificArgs``).
"""

from __future__ import annotations

from typing import Any, TypedDict


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
    vllm_cfg: dict[str, Any]
    vllm_kwargs: dict[str, Any]
    quant_cfg: str | None
    real_quant: bool
    real_quant_ignore: list[str] | None

"""How vLLM engines of several ranks split the generation devices and the model, and the layouts that cannot work.

One rule for each: pre-flight refuses a layout before any actor starts, `engine_bundle_groups` when it places the
engines, and the dry run's memory plan counts engines and sizes each rank's shard with the same arithmetic.

vLLM's constraints (0.32): a tensor-parallel rank holds whole attention heads, so ``tensor_parallel_size`` divides
``num_attention_heads``; the KV heads are split the same way, or, with more ranks than KV heads, each KV head is
copied onto ``tensor_parallel_size / num_key_value_heads`` ranks (so one of the two divides the other); the
vocabulary, padded to a multiple of 64, splits evenly too. Every pipeline stage holds at least one layer. Expert
parallelism spreads the routed experts over the engine's tensor-parallel ranks (`VllmConfig.uses_expert_parallel`),
whole experts each in this library's rule.
"""

from __future__ import annotations

from typing import Any

VOCAB_PADDING = 64  # vLLM pads the vocabulary of its embedding and head to a multiple of this, then splits it


def engine_split_problem(devices_per_engine: int, devices: int, owner: str, source: str = "") -> str | None:
    """Why ``devices`` generation devices of one node (``owner``: e.g. "node 1's") do not hold whole engines of
    ``devices_per_engine`` devices, or None; ``source``: the key that sets ``devices``, named in the line."""
    if devices % devices_per_engine == 0:
        return None
    set_by = f"{source}; " if source else ""
    return (
        f"tensor_parallel_size x pipeline_parallel_size = {devices_per_engine} devices per engine does not divide "
        f"{owner} {devices} generation devices ({set_by}an engine spans devices of one node)"
    )


def engines_per_node(devices_per_engine: int, devices: int) -> int:
    """Engines on a node of ``devices`` generation devices (at least one: a layout that does not divide is
    `engine_split_problem`'s to refuse)."""
    return max(devices // devices_per_engine, 1)


def kv_heads_per_rank(kv_heads: int, tensor_parallel_size: int) -> int:
    """KV heads one tensor-parallel rank holds: its share, or one replicated head when ranks outnumber them."""
    return max(kv_heads // tensor_parallel_size, 1)


def padded_vocab(vocab_size: int) -> int:
    """The vocabulary vLLM's embedding and head hold, split over the tensor-parallel ranks."""
    return -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING


def stage_layers(num_layers: int, pipeline_parallel_size: int) -> int:
    """Decoder layers of the largest pipeline stage (vLLM gives the remainder to stages one layer each)."""
    return -(-num_layers // pipeline_parallel_size)


def model_layout_problems(vllm_cfg: Any, hf_config: Any, prefix: str) -> list[str]:
    """What in the engine's layout (``vllm_cfg``: a `VllmConfig` under ``prefix``) the model (``hf_config``: its
    Hugging Face config, overrides applied) cannot be split by; one line each, naming the key."""
    from nemo_rl_clone.models.policy.dtensor.moe import num_routed_experts

    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    tp, pp = vllm_cfg.tensor_parallel_size, vllm_cfg.pipeline_parallel_size
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    layers = getattr(text, "num_hidden_layers", None)
    problems = []
    if heads and heads % tp:
        problems.append(
            f"{prefix}.tensor_parallel_size: {tp} must divide the model's num_attention_heads={heads} (each engine "
            "rank holds whole heads)"
        )
    elif kv_heads and (kv_heads % tp if tp <= kv_heads else tp % kv_heads):
        problems.append(
            f"{prefix}.tensor_parallel_size: {tp} and the model's num_key_value_heads={kv_heads} must divide one "
            "another (vLLM splits the KV heads over the ranks, or copies each onto tensor_parallel_size / "
            "num_key_value_heads ranks)"
        )
    vocab = getattr(text, "vocab_size", None)
    if vocab and padded_vocab(vocab) % tp:
        problems.append(
            f"{prefix}.tensor_parallel_size: {tp} must divide the model's vocabulary padded to a multiple of "
            f"{VOCAB_PADDING} ({padded_vocab(vocab)}; vocab_size={vocab}), which vLLM splits over the ranks"
        )
    if layers and pp > layers:
        problems.append(
            f"{prefix}.pipeline_parallel_size: {pp} is more than the model's num_hidden_layers={layers} (each "
            "pipeline stage holds at least one layer)"
        )
    if vllm_cfg.uses_expert_parallel:
        key = f"{prefix}.{'expert_parallel_size' if vllm_cfg.expert_parallel_size > 1 else 'enable_expert_parallel'}"
        experts = num_routed_experts(hf_config)
        if not experts:
            problems.append(f"{key}: expert parallelism needs an MoE model; this one is dense (no routed experts)")
        elif experts % tp:
            problems.append(
                f"{key}: the engine's expert-parallel size {tp} (its tensor_parallel_size) must divide the model's "
                f"{experts} routed experts"
            )
    return problems

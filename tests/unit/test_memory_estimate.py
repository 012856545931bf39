"""The memory model's arithmetic, on SmolLM2-135M's shape (counted from its config on the meta device)."""

from __future__ import annotations

import dataclasses

import pytest

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.models.generation.config import VllmConfig
from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path
from nemo_rl_clone.models.memory_estimate import (
    ENGINE_RANK_RUNTIME_BYTES,
    ENGINE_RUNTIME_BYTES,
    POLICY_RUNTIME_BYTES,
    ModelShape,
    engine_kv_cache_tokens,
    engine_memory,
    engine_rank_parameters,
    engine_workers,
    megatron_worker_memory,
    policy_worker_memory,
    refit_bytes,
)
from nemo_rl_clone.utils.config import load_validated_config
from tests.functional.supervised_runs import REPO

H, MLP, L, V, KV = 576, 1536, 30, 49152, 192  # SmolLM2-135M: hidden, MLP, layers, vocabulary, k/v width (3 heads × 64)
# Tied embeddings once; per layer q, o (H×H), k, v (H×KV), gate, up, down (H×MLP), two norms; the final norm.
SMOLLM2_PARAMETERS = V * H + L * (2 * H * H + 2 * H * KV + 3 * H * MLP + 2 * H) + H


@pytest.fixture(scope="module")
def shape() -> ModelShape:
    return ModelShape.of(resolve_model_path("SmolLM2-135M-Instruct"))


def main_job(*overrides: str) -> GRPOMasterConfig:
    return load_validated_config(REPO / "configs" / "grpo_smollm2_cpu.yaml", overrides, GRPOMasterConfig)


def test_shape_from_the_config_without_weights(shape):
    heads = {"num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "tied_embeddings": True}
    assert shape == ModelShape(SMOLLM2_PARAMETERS, L, H, MLP, V, **heads)
    assert SMOLLM2_PARAMETERS == 134_515_008


def test_main_job_policy_worker(shape):
    policy = main_job().policy
    worker = policy_worker_memory(policy, shape, shards=1, reference=False)
    n = SMOLLM2_PARAMETERS
    assert worker.parts == {
        "parameters": 4 * n,  # fp32 master weights, no compute copy in fp32
        "gradients": 4 * n,
        "optimizer": 8 * n,  # AdamW's two fp32 moments
        "reference": 0,  # no KL term in the main job
        "activations": 2048 * L * (5 * H + 4 * MLP) * 4,  # train_mb_tokens of the packed microbatch, fp32
        "logits": 2 * 1024 * V * 4,  # one chunk of the selective head: logits and softmax
        "kv_cache": 0,
        "refit": 0,  # no engine given
        "runtime": POLICY_RUNTIME_BYTES,
    }


def test_knobs_move_the_estimate(shape):
    n = SMOLLM2_PARAMETERS
    base = policy_worker_memory(main_job().policy, shape, shards=1, reference=False)
    with_kl = policy_worker_memory(main_job().policy, shape, shards=1, reference=True)
    assert with_kl.total - base.total == 4 * n
    bf16 = policy_worker_memory(main_job("policy.precision=bfloat16").policy, shape, shards=1, reference=False)
    assert bf16.parts["parameters"] == 6 * n and bf16.parts["activations"] == base.parts["activations"] // 2
    sharded = policy_worker_memory(main_job().policy, shape, shards=2, reference=False)
    assert sharded.parts["optimizer"] == 4 * n and sharded.parts["activations"] == base.parts["activations"]
    checkpointed = main_job("policy.dtensor_cfg.activation_checkpointing=true").policy
    assert policy_worker_memory(checkpointed, shape, 1, False).parts["activations"] == 2048 * L * H * 4
    padded = main_job("policy.sequence_packing.enabled=false").policy  # 8 × 256 tokens: the same budget
    assert policy_worker_memory(padded, shape, 1, False).parts["activations"] == base.parts["activations"]
    full = main_job("policy.dtensor_cfg.logits_at_loss_tokens_only=false").policy
    assert policy_worker_memory(full, shape, 1, False).parts["logits"] == 3 * 2048 * V * 4
    lora = policy_worker_memory(main_job("policy.dtensor_cfg.lora_cfg.enabled=true").policy, shape, 1, True)
    # rank-8 adapters on every linear layer: ~2.6 M trainable parameters, 2% of the model's Adam state
    assert lora.parts["reference"] == 0 and lora.parts["optimizer"] < 0.03 * base.parts["optimizer"]


def test_engine_on_cpu_and_gpu(shape):
    vllm_cfg = main_job().policy.generation.vllm_cfg
    cpu = engine_memory(vllm_cfg, shape, device_bytes=None, count=1)
    n = SMOLLM2_PARAMETERS
    assert cpu.parts["parameters"] == 4 * n and cpu.parts["refit"] == 2 * 4 * n  # fp32 weights; a refit's two copies
    assert cpu.parts["kv_cache"] == 1 << 30 and cpu.parts["runtime"] == ENGINE_RUNTIME_BYTES
    assert refit_bytes(vllm_cfg, shape, colocated=True, on_gpu=False) == 2 * 4 * n  # gathered + object store
    assert refit_bytes(vllm_cfg, shape, colocated=True, on_gpu=True) == 0  # host memory, not the GPU's
    gpu = engine_memory(vllm_cfg, shape, device_bytes=80 * 10**9, count=1)  # kv_cache_memory_bytes wins in vLLM
    assert gpu.parts["kv_cache"] == 1 << 30
    by_share = dataclasses.replace(vllm_cfg, kv_cache_memory_bytes=None)  # gpu_memory_utilization 0.6
    gpu = engine_memory(by_share, shape, device_bytes=80 * 10**9, count=1)
    assert gpu.parts["parameters"] + gpu.parts["kv_cache"] == 48 * 10**9


def near(estimate: int, exact: int, rel: float) -> bool:
    return abs(estimate - exact) <= rel * exact


def test_an_engine_rank_holds_its_stage_and_its_share_of_each_layer(shape):
    """SmolLM2 in an engine of TP 3 × PP 2, as vLLM lays it out: each stage 15 layers, every projection split 3 ways
    (k and v: one of the 3 KV heads), norms whole; the first stage the embedding, the last its own copy of the tied
    head and the final norm, each a third of the 49,152-row table. The estimate counts norms as split: within 0.1%."""
    cfg = VllmConfig(tensor_parallel_size=3, pipeline_parallel_size=2)
    per_layer = 2 * H * (9 * 64) // 3 + 2 * H * 64 + 3 * H * MLP // 3 + 2 * H
    last_stage = 15 * per_layer + V // 3 * H + H
    assert near(engine_rank_parameters(cfg, shape), last_stage, 1e-3)
    assert engine_rank_parameters(VllmConfig(), shape) == SMOLLM2_PARAMETERS  # one rank: the whole model
    # KV cache: a rank keeps 15 layers × 1 KV head of 64, K and V, in bf16 by default
    assert engine_kv_cache_tokens(cfg, shape, 1 << 30) == (1 << 30) // (2 * 15 * 1 * 64 * 2)


def test_ranks_outnumbering_kv_heads_hold_a_copied_head():
    """tiny-random-llama (hidden 128, 4 heads / 2 KV heads of 32, MLP 256, 2 layers, tied 49,152-row table) over 4
    ranks: each holds a whole KV head (copied onto 2 ranks), not half of one. Norms whole; within 0.1% (a half KV
    head would be 0.5% off)."""
    tiny = ModelShape.of(resolve_model_path(TINY_LLAMA))
    per_layer = 2 * 128 * 32 + 2 * 128 * 32 + 3 * 128 * 256 // 4 + 2 * 128
    assert near(engine_rank_parameters(VllmConfig(tensor_parallel_size=4), tiny), 2 * per_layer + V // 4 * 128, 1e-3)
    assert engine_kv_cache_tokens(VllmConfig(tensor_parallel_size=4), tiny, 1 << 20) == (1 << 20) // (2 * 2 * 32 * 2)


def test_engines_of_several_ranks_on_cpu_and_gpu(shape):
    """Two engines of TP 3 on a node of 6 CPU slots: the engine actors (runtime, a refit's whole state dict) and 6
    rank processes (a third of the weights each, a KV cache of kv_cache_memory_bytes each: vLLM's size is per
    device, the whole incoming state dict twice on refit: as it arrives and unpacked)."""
    n = SMOLLM2_PARAMETERS
    cfg = VllmConfig(precision="float32", tensor_parallel_size=3, kv_cache_memory_bytes=1 << 28)
    actors, ranks = engine_workers(cfg, shape, device_bytes=None, engines=2)
    assert (actors.kind, actors.count, ranks.kind, ranks.count) == ("generation engine", 2, "engine rank", 6)
    assert actors.parts["refit"] == 4 * n and actors.parts["parameters"] == actors.parts["kv_cache"] == 0
    assert actors.parts["runtime"] == ENGINE_RUNTIME_BYTES
    assert ranks.parts["parameters"] == 4 * engine_rank_parameters(cfg, shape) and ranks.parts["refit"] == 2 * 4 * n
    assert ranks.parts["kv_cache"] == 1 << 28 and ranks.parts["runtime"] == ENGINE_RANK_RUNTIME_BYTES
    gpu = VllmConfig(tensor_parallel_size=3, gpu_memory_utilization=0.5)  # bf16
    (_, rank) = engine_workers(gpu, shape, device_bytes=80 * 10**9, engines=1)
    assert rank.parts["parameters"] + rank.parts["kv_cache"] == 40 * 10**9 and rank.parts["refit"] == 0
    fixed = VllmConfig(tensor_parallel_size=3, kv_cache_memory_bytes=10**9)  # vLLM then ignores the utilisation
    assert engine_workers(fixed, shape, device_bytes=80 * 10**9, engines=1)[1].parts["kv_cache"] == 10**9
    (single,) = engine_workers(VllmConfig(), shape, device_bytes=None, engines=2)
    assert single == engine_memory(VllmConfig(), shape, None, 2)  # one rank: the engine as before


def test_worker_peaks_are_logged_as_memory_metrics():
    from nemo_rl_clone.models.policy.workers.train_profile import TrainProfile, memory_metrics, merge, profile_metrics

    ranks = [TrainProfile(forward_s=1.0, peak_rss_bytes=3_000_000_000), TrainProfile(peak_rss_bytes=5_000_000_000)]
    merged = merge(ranks)
    assert merged.peak_rss_bytes == 5_000_000_000  # the largest worker, whichever rank was slowest
    performance = {**profile_metrics(merged, training_s=1.0)["performance"], "generation_worker_peak_rss_gb": 2.5}
    assert memory_metrics(performance) == {"policy_worker_peak_rss_gb": 5.0, "generation_worker_peak_rss_gb": 2.5}
    assert not any(key.endswith("_peak_rss_gb") for key in performance)


# Qwen3-30B-A3B's published config: 48 layers, hidden 2,048, 32 query / 4 key-value heads of 128, 128 experts of
# intermediate 768 (8 per token), vocabulary 151,936, untied head.
Q_L, Q_H, Q_HEADS, Q_KV, Q_HD, Q_E, Q_MOE, Q_V = 48, 2048, 32, 4, 128, 128, 768, 151936
Q_EXPERTS = Q_L * Q_E * 3 * Q_H * Q_MOE  # gate, up, down of every expert
# Per layer: q (H × 32·128), k and v (H × 4·128), o (32·128 × H), q/k norms (128 each), router (E × H), two norms;
# embedding and head (V × H each), the final norm.
Q_DENSE = (
    Q_L * (2 * Q_H * Q_HEADS * Q_HD + 2 * Q_H * Q_KV * Q_HD + 2 * Q_HD + Q_E * Q_H + 2 * Q_H) + 2 * Q_V * Q_H + Q_H
)


@pytest.fixture(scope="module")
def qwen3_30b_a3b(tmp_path_factory) -> str:
    """A model folder holding only Qwen3-30B-A3B's config (no weights: the shape comes from the meta device)."""
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(
        vocab_size=Q_V,
        hidden_size=Q_H,
        intermediate_size=6144,
        moe_intermediate_size=Q_MOE,
        num_hidden_layers=Q_L,
        num_attention_heads=Q_HEADS,
        num_key_value_heads=Q_KV,
        num_experts=Q_E,
        num_experts_per_tok=8,
        tie_word_embeddings=False,
    )
    config.head_dim = Q_HD
    folder = tmp_path_factory.mktemp("qwen3-30b-a3b")
    config.save_pretrained(folder)
    return str(folder)


def test_the_qwen3_30b_a3b_recipe_fits_h200_gpus_in_its_megatron_layout(qwen3_30b_a3b):
    """configs/grpo_qwen3_30b_a3b_megatron.yaml: TP 4 × PP 4 × EP 4 with sequence parallelism over 64 GPUs. Each
    policy worker holds a 16th of the dense weights (TP × PP) and of the experts (EP × PP); the distributed optimizer
    shards Adam over 4 data-parallel ranks (4 expert-data-parallel ones for experts). Its peak and the engine's whole
    bf16 model fit a 141 GB GPU (H200); an 80 GB one holds the policy but not that engine, while the ranks of an
    engine of TP 8 fit it."""
    shape = ModelShape.of(qwen3_30b_a3b)
    assert (shape.num_parameters, shape.num_expert_parameters) == (Q_DENSE + Q_EXPERTS, Q_EXPERTS)
    assert 30.4e9 < shape.num_parameters < 30.6e9  # "30.5B" as published
    config = load_validated_config(
        REPO / "configs" / "grpo_qwen3_30b_a3b_megatron.yaml", [f"policy.model_name={qwen3_30b_a3b}"], GRPOMasterConfig
    )
    policy = config.policy
    world = config.cluster.gpus_per_node * config.cluster.num_nodes
    worker = megatron_worker_memory(policy, shape, world, reference=True)
    local = Q_DENSE // 16 + Q_EXPERTS // 16
    assert worker.parts["parameters"] == 2 * local  # bf16 model
    assert worker.parts["gradients"] == 2 * local  # grad_reduce_in_fp32 is off in the recipe
    assert worker.parts["optimizer"] == 12 * (Q_DENSE // 16 // 4 + Q_EXPERTS // 16 // 4)
    assert worker.parts["logits"] == 3 * 4096 * Q_V // 4 * 4  # one 4,096-token microbatch, fp32 logits over TP 4
    whole = dataclasses.replace(policy, megatron_cfg=dataclasses.replace(policy.megatron_cfg, sequence_parallel=False))
    unsplit = megatron_worker_memory(whole, shape, world, reference=True).parts["activations"]
    assert worker.parts["activations"] == unsplit // 4  # sequence parallelism splits them over the 4 TP ranks
    # Context parallelism (with the packing it needs) halves them again; the logits are read gathered: whole.
    packed = dataclasses.replace(policy.sequence_packing, enabled=True, train_mb_tokens=4096)
    cp2 = dataclasses.replace(
        policy, sequence_packing=packed, megatron_cfg=dataclasses.replace(policy.megatron_cfg, context_parallel_size=2)
    )
    cp_worker = megatron_worker_memory(cp2, shape, world, reference=True)
    assert cp_worker.parts["activations"] == unsplit // 8 and cp_worker.parts["logits"] == worker.parts["logits"]
    h200, h100 = 141e9, 80e9
    assert worker.total < 0.5 * h200
    engine = engine_memory(policy.generation.vllm_cfg, shape, int(h200), count=8)
    assert engine.parts["parameters"] == 2 * shape.num_parameters and engine.parts["kv_cache"] > 30e9
    assert engine_memory(policy.generation.vllm_cfg, shape, int(h100), count=8).parts["kv_cache"] == 0
    # An engine of TP 8: each rank an eighth of the layers and experts, one of the 4 KV heads (copied onto 2 ranks),
    # an eighth of the embedding and of the head; the router and norms, whole in vLLM, are counted as split: 0.5%.
    tp8 = dataclasses.replace(policy.generation.vllm_cfg, tensor_parallel_size=8)
    attention = 2 * Q_H * Q_HEADS * Q_HD // 8 + 2 * Q_H * Q_HD + 2 * Q_HD
    rank = Q_L * (attention + Q_E * Q_H + 2 * Q_H) + Q_EXPERTS // 8 + 2 * Q_V // 8 * Q_H + Q_H
    assert near(engine_rank_parameters(tp8, shape), rank, 5e-3)
    (_, ranks) = engine_workers(tp8, shape, int(h100), engines=1)
    assert ranks.count == 8 and ranks.parts["kv_cache"] > 30e9  # the model split 8 ways fits an 80 GB GPU

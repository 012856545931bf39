"""The memory model's arithmetic, on SmolLM2-135M's shape (counted from its config on the meta device)."""

from __future__ import annotations

import pytest

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.models.huggingface import resolve_model_path
from nemo_rl_clone.models.memory_estimate import (
    ENGINE_RUNTIME_BYTES,
    POLICY_RUNTIME_BYTES,
    ModelShape,
    engine_memory,
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
    assert shape == ModelShape(SMOLLM2_PARAMETERS, L, H, MLP, V)
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
    gpu = engine_memory(vllm_cfg, shape, device_bytes=80 * 10**9, count=1)  # gpu_memory_utilization 0.6
    assert gpu.parts["parameters"] + gpu.parts["kv_cache"] == 48 * 10**9


def test_worker_peaks_are_logged_as_memory_metrics():
    from nemo_rl_clone.models.policy.workers.train_profile import TrainProfile, memory_metrics, merge, profile_metrics

    ranks = [TrainProfile(forward_s=1.0, peak_rss_bytes=3_000_000_000), TrainProfile(peak_rss_bytes=5_000_000_000)]
    merged = merge(ranks)
    assert merged.peak_rss_bytes == 5_000_000_000  # the largest worker, whichever rank was slowest
    performance = {**profile_metrics(merged, training_s=1.0)["performance"], "generation_worker_peak_rss_gb": 2.5}
    assert memory_metrics(performance) == {"policy_worker_peak_rss_gb": 5.0, "generation_worker_peak_rss_gb": 2.5}
    assert not any(key.endswith("_peak_rss_gb") for key in performance)

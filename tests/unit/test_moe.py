"""Mixture-of-experts models outside the Megatron backend: the built-in tiny Qwen3-MoE (8 experts, top-2, 2 layers),
its export and refit in the checkpoint layout, vLLM serving refitted MoE weights exactly, and the DTensor backend's
router load-balancing loss against the Switch Transformer formula computed by hand.

The GRPO runs on the MoE model (both backends) are in tests/functional/test_moe_grpo.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from nemo_rl_clone.algorithms.grpo.refit import init_refit_collective, prepare_refit, refit_policy_generation
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.generation.vllm import VllmGeneration
from nemo_rl_clone.models.hf_export import save_consolidated_hf, to_checkpoint_layout
from nemo_rl_clone.models.huggingface import TINY_QWEN3_MOE, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.dtensor import moe
from tests.unit.hf_weight_source import HFPolicyStandIn, perturbed_model
from tests.unit.test_vllm_refit import engine_vs_reference_gap
from tests.unit.vllm_test_utils import LOGPROB_ATOL, tiny_config

EXPERTS, TOP_K, LAYERS = 8, 2, 2


@pytest.fixture(scope="module")
def model_path() -> str:
    return resolve_model_path(TINY_QWEN3_MOE)


# ------------------------------------------------------------------ the model and its checkpoint layout
def test_the_built_in_moe_model_is_stored_per_expert_and_exports_back_to_that_layout(
    model_path: str, tmp_path: Path
) -> None:
    """transformers holds each layer's experts fused ([experts, 2 × ffn, hidden]); the folder, the export and what
    the engines are sent hold one tensor per expert and projection, under the names vLLM and from_pretrained read."""
    model = perturbed_model(model_path, seed=3)
    fused = dict(model.state_dict())
    assert fused["model.layers.0.mlp.experts.gate_up_proj"].shape == (EXPERTS, 2 * 64, 128)
    layout = to_checkpoint_layout(model, fused)
    per_expert = {name for name in layout if ".mlp.experts." in name}
    assert len(per_expert) == LAYERS * EXPERTS * 3
    # expert 5's gate projection is the first half of its fused gate_up rows (gate first, then up)
    gate_5 = layout["model.layers.1.mlp.experts.5.gate_proj.weight"]
    assert torch.equal(gate_5, fused["model.layers.1.mlp.experts.gate_up_proj"][5, :64])
    assert torch.equal(
        layout["model.layers.1.mlp.experts.5.up_proj.weight"], fused["model.layers.1.mlp.experts.gate_up_proj"][5, 64:]
    )
    assert torch.equal(
        layout["model.layers.1.mlp.experts.5.down_proj.weight"], fused["model.layers.1.mlp.experts.down_proj"][5]
    )

    folder = save_consolidated_hf(fused, model.config, tmp_path / "export", tokenizer=load_tokenizer(TINY_QWEN3_MOE))
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as stored:
        assert per_expert <= set(stored.keys())
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert all(torch.equal(reloaded.state_dict()[name], tensor) for name, tensor in fused.items())
    # the built-in folder itself is in that layout
    with safe_open(str(Path(model_path) / "model.safetensors"), "pt") as stored:
        assert "model.layers.0.mlp.experts.7.down_proj.weight" in set(stored.keys())


def test_mixtral_maps_to_its_checkpoint_names_and_its_router_loss_reads_its_config() -> None:
    """Mixtral, the second MoE family: fused in memory like Qwen3-MoE, stored as ``block_sparse_moe.experts.{e}.w1``
    (gate), ``w3`` (up), ``w2`` (down); its expert count is ``num_local_experts``."""
    from transformers import MixtralConfig

    config = MixtralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    model = AutoModelForCausalLM.from_config(config)
    fused = dict(model.state_dict())
    layout = to_checkpoint_layout(model, fused)
    gate_up = fused["model.layers.0.mlp.experts.gate_up_proj"]
    prefix = "model.layers.0.block_sparse_moe.experts.3"
    assert torch.equal(layout[f"{prefix}.w1.weight"], gate_up[3, :32])
    assert torch.equal(layout[f"{prefix}.w3.weight"], gate_up[3, 32:])
    assert torch.equal(layout[f"{prefix}.w2.weight"], fused["model.layers.0.mlp.experts.down_proj"][3])
    assert "model.layers.0.block_sparse_moe.gate.weight" in layout
    router_loss = moe.RouterAuxLoss(config)
    assert (router_loss.num_experts, router_loss.top_k) == (4, 2)


# ------------------------------------------------------------------ vLLM serves refitted MoE weights exactly
@pytest.fixture(scope="module")
def moe_generation(ray_local: None) -> Iterator[tuple[VllmGeneration, RayVirtualCluster]]:
    """One engine of the tiny MoE on vLLM's async engine (its core in a child process: the packed-bytes load)."""
    cluster = RayVirtualCluster([1], use_gpus=False, name="vllm-moe-test")
    config = tiny_config()
    config.vllm_cfg.async_engine = True
    generation = VllmGeneration(cluster, config, TINY_QWEN3_MOE, name_prefix="vllm-moe-test")
    yield generation, cluster
    generation.shutdown()
    cluster.shutdown()


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "collective"])
def test_vllm_serves_refitted_moe_weights_exactly(
    moe_generation: tuple[VllmGeneration, RayVirtualCluster], model_path: str, colocated: bool
) -> None:
    """After a refit the engine's greedy logprobs equal the new HF model's (fp32, tolerance 1e-4; measured ~1e-6).
    vLLM 0.32's own in-place reload leaves the CPU experts kernel reading unpacked weights (0.63 off on this model,
    engine_extension.prepack_cpu_experts_again); the old weights are > 1e-2 away, so the check tells them apart."""
    generation, cluster = moe_generation
    tokenizer = load_tokenizer(TINY_QWEN3_MOE)
    tokenizer.padding_side = "right"
    seed = 21 if colocated else 22
    trainer = HFPolicyStandIn(model_path, seed=seed)
    try:
        prepare_refit(trainer, generation)
        if not colocated:
            init_refit_collective(trainer, generation, cluster, timeout_s=60.0)
        refit_policy_generation(trainer, generation, colocated=colocated)
    finally:
        trainer.shutdown()
    assert engine_vs_reference_gap(generation, tokenizer, perturbed_model(model_path, seed)) <= LOGPROB_ATOL
    assert engine_vs_reference_gap(generation, tokenizer, perturbed_model(model_path, seed + 100)) > 1e-2


# ------------------------------------------------------------------ the DTensor backend's router loss
def switch_loss_by_hand(layers: list[torch.Tensor], valid: torch.Tensor) -> float:
    """Switch Transformer's load-balancing loss (Fedus et al. 2021, eq. 4-6, top-k as Mixtral/Qwen use it) over the
    valid tokens of every layer taken together: E × Σ_e f_e · P_e with f_e the share of top-k assignments per token
    that go to expert e and P_e the mean router probability of e."""
    rows = torch.cat([logits[valid.reshape(-1)] for logits in layers]).double()
    probs = rows.softmax(-1)
    counts = torch.zeros(EXPERTS, dtype=torch.float64)
    for expert in probs.topk(TOP_K, dim=-1).indices.reshape(-1).tolist():
        counts[expert] += 1
    return float(EXPERTS * ((counts / len(rows)) * probs.mean(0)).sum())


def test_router_loss_is_the_switch_transformer_loss_over_valid_tokens(model_path: str) -> None:
    config = AutoConfig.from_pretrained(model_path)
    config.router_aux_loss_coef = 0.01
    router_loss = moe.RouterAuxLoss(config)
    assert (router_loss.num_experts, router_loss.top_k, router_loss.coef) == (EXPERTS, TOP_K, 0.01)
    generator = torch.Generator().manual_seed(0)
    rows, width = 3, 7
    lengths = torch.tensor([7, 4, 2])
    layers = tuple(3 * torch.randn(rows * width, EXPERTS, generator=generator) for _ in range(LAYERS))
    valid = torch.arange(width) < lengths[:, None]

    loss = torch.tensor(1.5, dtype=torch.float32)
    total, metrics = router_loss.add_to(loss, {"loss": 1.5}, layers, lengths, share=0.25)
    expected = switch_loss_by_hand(list(layers), valid)
    assert metrics["router_aux_loss"] == pytest.approx(0.25 * expected, abs=1e-6)
    assert float(total) == pytest.approx(1.5 + 0.01 * 0.25 * expected, abs=1e-6)
    # padding counted as tokens gives another value (the check can tell): masking matters on this batch
    with_padding = switch_loss_by_hand(list(layers), torch.ones_like(valid))
    assert abs(with_padding - expected) > 1e-3
    _, packed = router_loss.add_to(loss, {}, layers, None, share=1.0)
    assert packed["router_aux_loss"] == pytest.approx(with_padding, abs=1e-6)


def test_moe_models_refuse_the_parallelisms_the_dtensor_backend_lacks(model_path: str) -> None:
    config = AutoConfig.from_pretrained(model_path)
    assert moe.num_routed_experts(config) == EXPERTS
    assert moe.refusal(config, 1, 1) is None
    assert "tensor_parallel_size > 1 with an MoE model" in str(moe.refusal(config, 2, 1))
    assert "context_parallel_size > 1 with an MoE model" in str(moe.refusal(config, 1, 2))
    dense: Any = AutoConfig.from_pretrained(resolve_model_path("tiny-random-llama"))
    assert moe.num_routed_experts(dense) == 0 and moe.refusal(dense, 2, 2) is None

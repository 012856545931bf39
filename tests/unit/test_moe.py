"""Mixture-of-experts models outside the Megatron backend: the built-in tiny Qwen3-MoE (8 experts, top-2, 2 layers),
its export and refit in the checkpoint layout, vLLM serving refitted MoE weights exactly, the engine's record of
each token's experts against Hugging Face's routing, router replay against an MoE block computed by hand, and the
DTensor backend's router load-balancing loss against the Switch Transformer formula computed by hand, and that with it
every row of a GRPO step trains.

The GRPO runs on the MoE model (both backends) are in tests/functional/test_moe_grpo.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from nemo_rl_clone.data.interfaces import merge_routing
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.generation.vllm import VllmGeneration
from nemo_rl_clone.models.hf_export import save_consolidated_hf, to_checkpoint_layout
from nemo_rl_clone.models.huggingface import TINY_QWEN3_MOE, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.dtensor import moe
from nemo_rl_clone.rollout.refit import init_refit_collective, prepare_refit, refit_policy_generation
from nemo_rl_clone.utils.errors import UserInputError
from tests.unit.hf_weight_source import HFPolicyStandIn, perturbed_model
from tests.unit.vllm_test_utils import LOGPROB_ATOL, PROMPTS, engine_vs_reference_gap, prompt_batch, tiny_config

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
    """One in-process engine of the tiny MoE recording each token's routed experts (``policy.router_replay``)."""
    cluster = RayVirtualCluster([1], use_gpus=False, name="vllm-moe-test")
    generation = VllmGeneration(
        cluster, tiny_config(), TINY_QWEN3_MOE, name_prefix="vllm-moe-test", record_routing=True
    )
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


def refit_and_tokenizer(generation: VllmGeneration, model_path: str, seed: int) -> Any:
    """Refits the engine (colocated) with `perturbed_model(model_path, seed)`; returns the right-padding tokenizer."""
    trainer = HFPolicyStandIn(model_path, seed=seed)
    try:
        prepare_refit(trainer, generation)
        refit_policy_generation(trainer, generation, colocated=True)
    finally:
        trainer.shutdown()
    tokenizer = load_tokenizer(TINY_QWEN3_MOE)
    tokenizer.padding_side = "right"
    return tokenizer


def test_the_engine_records_the_experts_of_every_computed_token(
    moe_generation: tuple[VllmGeneration, RayVirtualCluster], model_path: str
) -> None:
    """Prompt and generated tokens (the batch decodes together) carry the experts vLLM routed them to: in fp32 the
    same sets as Hugging Face's router over the whole sequence, at every position but the last (never computed).
    After a refit, so the engine routes with the new router weights."""
    generation, _ = moe_generation
    tokenizer = refit_and_tokenizer(generation, model_path, seed=23)
    data = prompt_batch(tokenizer, PROMPTS)
    out = generation.generate(data)  # sampled
    model = perturbed_model(model_path, seed=23)
    routed = out["routed_experts"]
    assert routed.shape[:2] == out["output_ids"].shape and routed.shape[2:] == (LAYERS, TOP_K)
    for row in range(data.size):
        total = int(out["unpadded_sequence_lengths"][row])
        expected = hf_routing(model, out["output_ids"][row, :total].tolist())[: total - 1]
        assert torch.equal(routed[row, : total - 1].long().sort(-1).values, expected.sort(-1).values), row
        assert (routed[row, total - 1 :] == -1).all()


def test_a_multi_turn_sample_keeps_each_position_as_the_engine_first_routed_it(
    moe_generation: tuple[VllmGeneration, RayVirtualCluster], model_path: str
) -> None:
    """Turn 2's request is turn 1's sequence + an observation; the merged record keeps turn 1's routing where turn 1
    computed a position (its prompt and sampled tokens) and takes turn 2's for the rest (turn 1's last token, the
    observation, turn 2's tokens). In fp32 both turns route like Hugging Face over the final sequence."""
    generation, _ = moe_generation
    tokenizer = refit_and_tokenizer(generation, model_path, seed=24)
    first_input = prompt_batch(tokenizer, PROMPTS[:2])
    first = generation.generate(first_input)
    observation = tokenizer(" Environment: try again.")["input_ids"]
    rows = [first["output_ids"][row, : int(first["unpadded_sequence_lengths"][row])].tolist() for row in range(2)]
    rows = [row + observation for row in rows]
    width = max(map(len, rows))
    second_input = BatchedDataDict(
        input_ids=torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows]),
        input_lengths=torch.tensor([len(row) for row in rows]),
    )
    second = generation.generate(second_input)
    model = perturbed_model(model_path, seed=24)
    for row in range(2):
        turn1 = first["routed_experts"][row, : int(first["unpadded_sequence_lengths"][row])]
        total = int(second["unpadded_sequence_lengths"][row])
        turn2 = second["routed_experts"][row, :total]
        merged = merge_routing(turn1, turn2)
        computed = len(turn1) - 1  # turn 1 never computes its own last token
        assert torch.equal(merged[:computed], turn1[:computed]) and torch.equal(merged[computed:], turn2[computed:])
        expected = hf_routing(model, second["output_ids"][row, :total].tolist())[: total - 1]
        assert torch.equal(merged[: total - 1].long().sort(-1).values, expected.sort(-1).values), row


def test_merge_routing_keeps_the_first_record_of_each_position() -> None:
    earlier = torch.tensor([[[0, 1]], [[2, 3]], [[-1, -1]]], dtype=torch.int16)  # [positions, layers, k]
    latest = torch.tensor([[[4, 5]], [[6, 7]], [[1, 2]], [[3, 0]], [[-1, -1]]], dtype=torch.int16)
    merged = merge_routing(earlier, latest)
    assert merged.tolist() == [[[0, 1]], [[2, 3]], [[1, 2]], [[3, 0]], [[-1, -1]]]
    assert merge_routing(None, latest) is latest and latest[0].tolist() == [[4, 5]]  # the inputs are left as they are


def hf_routing(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """``[positions, layers, k]`` expert ids of Hugging Face's routers over ``ids``."""
    chosen: list[torch.Tensor] = []
    hooks = [
        module.register_forward_hook(lambda _m, _i, output: chosen.append(output[2]))
        for name, module in model.named_modules()
        if name.endswith("mlp.gate")
    ]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(chosen, dim=1)


# ------------------------------------------------------------------ router replay in the DTensor backend
def moe_block_by_hand(block: torch.nn.Module, x: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """A Qwen3-MoE block routed to ``experts`` ``[tokens, k]``: Σ_k w_k · down_e(silu(gate_e x) · up_e x) with w the
    router's softmax probabilities of those experts renormalised (norm_topk_prob), from the raw weights."""
    probs = (x @ block.gate.weight.T).softmax(-1)
    weights = probs.gather(-1, experts)
    weights = weights / weights.sum(-1, keepdim=True)
    gate_up, down = block.experts.gate_up_proj, block.experts.down_proj
    ffn = down.shape[-1]
    out = torch.zeros_like(x)
    for token in range(len(x)):
        for slot, expert in enumerate(experts[token].tolist()):
            gate, up = (gate_up[expert] @ x[token]).split(ffn)
            out[token] += weights[token, slot] * (down[expert] @ (torch.nn.functional.silu(gate) * up))
    return out


def test_router_replay_routes_tokens_to_the_recorded_experts(model_path: str) -> None:
    """Replaying the model's own routing changes nothing (bit-equal logits); a recorded routing that differs gives the
    MoE block computed by hand for those experts (fp32, 1e-5), keeps positions without a record (-1) on the model's
    own routing, and still trains the router. A dense model is refused in one line."""
    model = perturbed_model(model_path, seed=4)
    replay = moe.RoutingReplay(model)
    assert len(replay.routers) == LAYERS
    ids = list(range(100, 112))
    own = hf_routing(model, ids)
    with torch.no_grad():
        plain = model(input_ids=torch.tensor([ids])).logits
        replay.routing = own
        assert torch.equal(model(input_ids=torch.tensor([ids])).logits, plain)
        replay.routing = None

    block = model.model.layers[0].mlp
    x = torch.randn(5, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        natural = block.gate(x)[2]
        forced = (natural + 3) % EXPERTS  # other experts for every token
        record = torch.stack([forced, forced], dim=1).to(torch.int16)  # layer 0's hook reads column 0
        record[4] = -1  # no record for the last token
        replay.routing = record
        got = block(x[None])[0]
        expected = moe_block_by_hand(block, x, torch.cat([forced[:4], natural[4:]]))
        replay.routing = None
        assert (got - expected).abs().max() < 1e-5
        assert (block(x[None])[0] - expected).abs().max() > 1e-3  # the forced routing really differs

    replay.routing = torch.stack([forced, forced], dim=1)
    block(x[None]).sum().backward()
    assert block.gate.weight.grad is not None and block.gate.weight.grad.abs().sum() > 0
    replay.routing = None

    dense = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-random-llama"))
    with pytest.raises(UserInputError, match=r"^policy.router_replay.enabled: the model has no Hugging Face MoE"):
        moe.RoutingReplay(dense)


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


def test_router_replay_validates_where_it_is_built_and_names_the_key_elsewhere() -> None:
    from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
    from nemo_rl_clone.utils.config import load_validated_config
    from nemo_rl_clone.utils.config_validation import ConfigError
    from tests.functional.supervised_runs import REPO

    smoke = REPO / "configs" / "grpo_smoke.yaml"
    on = ["++policy.router_replay.enabled=true"]
    assert load_validated_config(smoke, on, GRPOMasterConfig).policy.router_replay.enabled
    assert load_validated_config(smoke, [*on, "grpo.max_rollout_turns=2"], GRPOMasterConfig).grpo.max_rollout_turns == 2
    for override, key in (("policy.generation.vllm_cfg.async_engine=true", "policy.generation.vllm_cfg.async_engine"),):
        with pytest.raises(ConfigError) as error:
            load_validated_config(smoke, [*on, override], GRPOMasterConfig)
        (line,) = [line for line in map(str, error.value.problems) if "policy.router_replay.enabled" in line]
        assert line.startswith(f"{key}: not supported yet"), line


def test_with_a_router_loss_every_row_trains_and_the_gradient_is_the_whole_batchs(model_path: str) -> None:
    """`trained_rows` leaves out rows without a policy-loss gradient; the router loss runs over every row that runs,
    so with one (``router_aux_loss_coef`` 0.01) `Policy.train`'s plan must run them all. One step of plain SGD (lr 1,
    no clipping) from the same weights, fp32: the weight change is the gradient. With some zero-advantage rows the
    policy's step equals the step with skipping switched off (tolerance 1e-7: the same rows run, so only float noise
    could differ; measured 0) and leaving rows out anyway changes it by more than 1e-5 (measured 1.4e-3 of a largest
    entry 0.12). With none but zero-advantage rows the plan is the one without skipping (so is its gradient: the
    router loss's alone, largest entry 8.6e-4), which differs from one short row's router gradient (what the step
    took before) by 8.3e-3."""
    from nemo_rl_clone.models.policy.config import PolicyConfig
    from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker
    from nemo_rl_clone.models.policy.workers import worker_setup
    from nemo_rl_clone.utils.config_validation import validate_config
    from tests.unit.test_megatron_policy import make_batches
    from tests.unit.test_trained_rows import grpo_rows, router_loss_plans

    policy = {"model_name": model_path, "precision": "float32", "train_global_batch_size": 8}
    policy |= {"train_micro_batch_size": 4, "max_grad_norm": None, "scheduler": None}
    policy |= {"optimizer": {"name": "torch.optim.SGD", "kwargs": {"lr": 1.0}}}
    config = validate_config({**policy, "hf_config_overrides": {"router_aux_loss_coef": 0.01}}, PolicyConfig)
    worker_setup.set_single_process_env()
    worker = DTensorPolicyWorker(config, load_tokenizer(model_path), model_path, init_reference_model=False)
    try:
        params = [p.to_local() if hasattr(p, "to_local") else p for p in worker.model.parameters()]  # 1 rank: all
        start = [p.detach().clone() for p in params]

        def step(plan: Any) -> list[torch.Tensor]:
            worker.train(plan.shards[0], **plan.kwargs)
            with torch.no_grad():
                change = [before - p for before, p in zip(start, params, strict=True)]
                for before, p in zip(start, params, strict=True):
                    p.copy_(before)
            return change

        def gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
            return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))

        assert worker.has_router_aux_loss()
        data = make_batches()[0]  # 8 rows, row 7 masked
        plans = router_loss_plans(config, 1, grpo_rows(data, [0.0] * 4 + [1.0, -1.0, 0.5, -0.5]), True)
        grads = {name: step(plan) for name, plan in plans.items()}
        assert max(g.abs().max().item() for g in grads["every_row"]) > 1e-2, "the step must move the weights"
        assert gap(grads["policy"], grads["every_row"]) <= 1e-7
        assert gap(grads["skipping"], grads["every_row"]) > 1e-5, "the check can tell: skipping changes the gradient"

        plans = router_loss_plans(config, 1, grpo_rows(data, [0.0] * 8), worker.has_router_aux_loss())
        policy_plan, every_row = plans["policy"], plans["every_row"]
        assert policy_plan.shards[0].size == 8 and "loss_normalization" not in policy_plan.kwargs
        assert all(torch.equal(policy_plan.shards[0][k], every_row.shards[0][k]) for k in every_row.shards[0])
        assert plans["skipping"].shards[0].size == 1
        whole_batch, short_row = step(policy_plan), step(plans["skipping"])
        assert max(g.abs().max().item() for g in whole_batch) > 1e-4, "the router loss alone moves the weights"
        assert gap(short_row, whole_batch) > 1e-5
    finally:
        worker.shutdown()

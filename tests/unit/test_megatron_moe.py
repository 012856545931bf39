"""Qwen3-MoE in the Megatron backend: the HF ↔ Megatron conversion of experts, router and q/k norms (pure tensors),
and the policy worker at expert-parallel size 2 (2 gloo processes, no Ray) against Hugging Face and against itself at
EP=1.

One spawn of 2 processes runs every worker scenario in turn and records what the tests assert on:

- ``ep2``: EP=2 (4 experts per rank, data-parallel 2): logprobs, 3 Adam steps (router trained), a run checkpoint
  and an HF export after step 1;
- ``ep1``: the same 3 steps at EP=1 (every rank holds all 8 experts);
- ``ep2_to_ep1``/``ep1_to_ep2``: a run saved after step 1 (weights and optimizer) resumed at the other EP size;
- ``frozen``: EP=2 with ``freeze_moe_router`` (NeMo-RL's default), one step.

Tolerance: fp32, 1e-5 (the layouts only reorder float sums; measured ≤ 2e-6).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

from nemo_rl_clone.data.interfaces import ROUTED_EXPERTS
from nemo_rl_clone.models.policy.megatron import converter
from tests.unit.test_megatron_policy import hf_logprobs, make_batches, max_diff, policy_dict, spawn

ATOL = 1e-5
EXPERTS, MOE_FFN = 8, 16
TOP_K, LAYERS = 2, 2  # tiny-random-qwen3-moe (the worker scenarios' model) has EXPERTS experts too
DIMS = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}


def moe_config(**overrides: Any) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        **{
            **DIMS,
            "moe_intermediate_size": MOE_FFN,
            "num_experts": EXPERTS,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            **overrides,
        }
    )


def random_state(config: Any) -> dict[str, torch.Tensor]:
    """transformers' in-memory state dict (fused experts) with every tensor random, so any misplaced row shows."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param))
    return model.state_dict()


def shard_and_merge(full: dict, shape: converter.ModelShape, tp: int, ep: int, etp: int) -> dict[str, torch.Tensor]:
    """Cut ``full`` into every (TP rank, EP rank, expert-TP rank) share as the worker does, then merge it back as
    `gather_hf_state_dict` does."""
    layers = range(shape.num_layers)
    merged: dict[str, torch.Tensor] = {}
    for ep_rank in range(ep):
        shards = {
            (tp_rank, etp_rank): converter.shard_for_rank(
                full,
                tp_rank,
                tp,
                layers,
                True,
                True,
                converter.ExpertShard.of_rank(shape, ep_rank, ep, etp_rank, etp),
            )
            for tp_rank in range(tp)
            for etp_rank in range(etp)
        }
        offset = ep_rank * shape.num_experts // ep
        for name in shards[0, 0]:
            if converter.is_expert(name):
                parts = [shards[0, r][name] for r in range(etp)]
            elif ep_rank == 0:  # dense weights: every EP rank holds the same ones
                parts = [shards[r, 0][name] for r in range(tp)]
            else:
                continue
            merged[converter.to_global_name(name, layers, offset)] = converter.merge_tensor_parallel(name, parts)
    return merged


@pytest.mark.parametrize(("tp", "ep", "etp"), [(1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 2, 1), (1, 2, 2), (2, 2, 2)])
def test_moe_round_trip_is_bit_identical(tp: int, ep: int, etp: int) -> None:
    hf = random_state(moe_config())
    shape = converter.model_shape(moe_config())
    merged = shard_and_merge(converter.hf_to_megatron(hf, shape), shape, tp, ep, etp)
    got = converter.megatron_to_hf(merged, shape)
    assert got.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(got[name], tensor), name


def test_expert_ranks_hold_their_block_of_experts_with_gate_rows_first() -> None:
    """EP rank r holds global experts r*E/EP + j as local_experts.j; fc1 is [gate; up] (each half split over the
    expert-TP ranks); the router and the q/k norms are Megatron's names for HF's."""
    hf = random_state(moe_config())
    shape = converter.model_shape(moe_config())
    full = converter.hf_to_megatron(hf, shape)
    gate_up, down = hf["model.layers.1.mlp.experts.gate_up_proj"], hf["model.layers.1.mlp.experts.down_proj"]
    half = MOE_FFN // 2
    for ep_rank in range(2):
        for etp_rank in range(2):
            local = converter.shard_for_rank(
                full, 0, 1, range(2), True, True, converter.ExpertShard.of_rank(shape, ep_rank, 2, etp_rank, 2)
            )
            experts = {name for name in local if converter.is_expert(name)}
            assert len(experts) == 2 * 2 * EXPERTS // 2  # 2 layers × (fc1, fc2) × 4 local experts
            for j in range(EXPERTS // 2):
                e = ep_rank * EXPERTS // 2 + j
                rows = slice(etp_rank * half, (etp_rank + 1) * half)
                gate, up = gate_up[e, :MOE_FFN], gate_up[e, MOE_FFN:]
                prefix = f"decoder.layers.1.mlp.experts.local_experts.{j}."
                assert torch.equal(local[prefix + "linear_fc1.weight"], torch.cat([gate[rows], up[rows]]))
                assert torch.equal(local[prefix + "linear_fc2.weight"], down[e][:, rows])
            assert torch.equal(local["decoder.layers.1.mlp.router.weight"], hf["model.layers.1.mlp.gate.weight"])
    norm = full["decoder.layers.0.self_attention.q_layernorm.weight"]
    assert torch.equal(norm, hf["model.layers.0.self_attn.q_norm.weight"])
    assert "decoder.layers.0.mlp.linear_fc1.weight" not in full


def test_dense_qwen3_round_trips_with_qk_norms() -> None:
    config = Qwen3Config(**DIMS)
    hf = random_state(config)
    shape = converter.model_shape(config)
    assert shape.qk_layernorm and not shape.is_moe
    full = converter.hf_to_megatron(hf, shape)
    assert "decoder.layers.1.self_attention.k_layernorm.weight" in full
    got = converter.megatron_to_hf(shard_and_merge(full, shape, 2, 1, 1), shape)
    assert got.keys() == hf.keys() and all(torch.equal(got[n], t) for n, t in hf.items())


def test_model_shape_refuses_dense_layers_and_uneven_expert_splits() -> None:
    with pytest.raises(ValueError, match=r"whose every layer is sparse; this one has dense layers"):
        converter.model_shape(moe_config(mlp_only_layers=[0]))
    shape = converter.model_shape(moe_config())
    assert (shape.num_experts, shape.moe_topk, shape.moe_ffn_hidden_size, shape.norm_topk_prob) == (8, 2, 16, True)
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=3 must divide the model's num_experts=8"):
        converter.check_expert_parallel(shape, 3, 1)
    with pytest.raises(ValueError, match=r"expert_tensor_parallel_size=3 must divide the model's moe_intermediate"):
        converter.check_expert_parallel(shape, 1, 3)
    full = converter.hf_to_megatron(random_state(moe_config()), shape)
    one_ep_rank = {n: t for n, t in full.items() if not re.search(r"local_experts\.[4-7]\.", n)}
    with pytest.raises(KeyError, match=r"experts \[0, 1, 2, 3\] of 8 \(gather every EP rank's\)"):
        converter.megatron_to_hf(one_ep_rank, shape)


# ---------------------------------------------------------------------------- the worker (2 gloo processes)
STEPS = 3  # the issue's three Adam steps; make_batches has one batch per step


def _worker(model_dir: str, ep: int, **kwargs: Any) -> Any:
    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.config import PolicyConfig
    from nemo_rl_clone.models.policy.megatron.policy_worker import MegatronPolicyWorker
    from nemo_rl_clone.utils.config_validation import validate_config

    freeze = kwargs.pop("freeze", False)
    megatron = {"expert_model_parallel_size": ep, "moe_token_dispatcher_type": "allgather", "freeze_moe_router": freeze}
    megatron.update(kwargs.pop("megatron", {}))
    policy = policy_dict(model_dir, **megatron)
    policy["router_replay"] = {"enabled": kwargs.pop("router_replay", False)}
    config = validate_config(policy, PolicyConfig)
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)  # a fresh process group per worker
    return MegatronPolicyWorker(config, load_tokenizer(model_dir), model_dir, **kwargs)


def _step(worker: Any, data: Any) -> dict[str, Any]:
    from megatron.core import parallel_state

    from nemo_rl_clone.algorithms.loss import NLLLossFn

    dp = parallel_state.get_data_parallel_world_size()
    shard = data.shard_by_batch_size(dp)[parallel_state.get_data_parallel_rank()]
    result = worker.train(shard, NLLLossFn(), gbs=len(data["input_ids"]))
    state = worker.get_full_state_dict_for_refit()
    return {"loss": result["global_loss"].item(), "grad_norm": result["grad_norm"].item(), "state": state}


def run_scenarios(model_dir: str, run_dir: str, batches: list) -> dict[str, Any]:
    record: dict[str, Any] = {}
    worker = _worker(model_dir, 2)
    record["ep2_logprobs"] = worker.get_logprobs(batches[0])["logprobs"]
    record["refit_info"] = worker.prepare_refit_info()
    record["init_state"] = worker.get_full_state_dict_for_refit()
    record["ep2"] = [_step(worker, batches[0])]
    worker.save_checkpoint(f"{run_dir}/weights", f"{run_dir}/optimizer", save_hf_path=f"{run_dir}/hf_step_1")
    record["ep2"] += [_step(worker, batches[index]) for index in range(1, STEPS)]
    worker.shutdown()

    worker = _worker(model_dir, 1)
    record["ep1_has_router_aux_loss"] = worker.has_router_aux_loss()
    record["ep1"] = [_step(worker, batches[0])]
    worker.save_checkpoint(f"{run_dir}/ep1_weights", f"{run_dir}/ep1_optimizer")
    record["ep1"] += [_step(worker, batches[index]) for index in range(1, STEPS)]
    worker.shutdown()

    # Resuming at the other expert-parallel size: weights and optimizer state (Megatron chains a separate expert
    # optimizer only at EP > 1, so its state is mapped by parameter name).
    worker = _worker(model_dir, 1, weights_path=f"{run_dir}/weights", optimizer_path=f"{run_dir}/optimizer")
    record["resumed_state"] = worker.get_full_state_dict_for_refit()
    record["ep2_to_ep1"] = [_step(worker, batches[index]) for index in range(1, STEPS)]
    worker.shutdown()
    worker = _worker(model_dir, 2, weights_path=f"{run_dir}/ep1_weights", optimizer_path=f"{run_dir}/ep1_optimizer")
    record["ep1_to_ep2"] = [_step(worker, batches[index]) for index in range(1, STEPS)]
    worker.shutdown()

    worker = _worker(model_dir, 2, freeze=True, init_reference_model=False)
    record["frozen_requires_grad"] = {
        name: param.requires_grad for name, param in worker.model.named_parameters() if "router" in name
    }
    record["frozen"] = _step(worker, batches[0])
    worker.shutdown()

    # TP=2 × EP=2 (data-parallel 1): Megatron needs sequence parallelism for MoE under TP, which splits the tokens
    # evenly over the TP ranks; an odd width is padded.
    sequence_parallel = {"tensor_model_parallel_size": 2, "sequence_parallel": True}
    worker = _worker(model_dir, 2, megatron=sequence_parallel, router_replay=True, init_reference_model=False)
    record["tp2_odd_width_logprobs"] = worker.get_logprobs(odd_width(batches[0]))["logprobs"]
    forced = odd_width(batches[0])
    forced[ROUTED_EXPERTS] = forced_routing(batches[0])  # 16 positions recorded: more than the rows' 15
    record["tp2_replay_forced_logprobs"] = worker.get_logprobs(forced)["logprobs"]
    record["tp2"] = [_step(worker, batches[index]) for index in range(STEPS)]
    worker.shutdown()

    worker = _worker(model_dir, 2, router_replay=True, init_reference_model=False)
    record["replay_unrecorded_logprobs"] = worker.get_logprobs(batches[0])["logprobs"]
    forced = batches[0].copy()
    forced[ROUTED_EXPERTS] = forced_routing(batches[0])
    record["replay_forced_logprobs"] = worker.get_logprobs(forced)["logprobs"]
    record["replay_step"] = _step(worker, forced)
    worker.shutdown()

    aux = {"moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.1}
    worker = _worker(model_dir, 1, megatron=aux, init_reference_model=False)
    record["aux_loss"] = _step(worker, batches[0])
    record["aux_loss_grad_norms"] = _router_loss_grad_norms(worker, batches[0])
    worker.shutdown()
    return record


def _router_loss_grad_norms(worker: Any, data: Any) -> dict[str, dict[str, float]]:
    """Gradient norms of one GRPO step for each of `router_loss_plans`, all from the same weights (lr 0 keeps them;
    no scheduler to restore it): with some zero-advantage rows (``some``) and with only such rows (``none``)."""
    from megatron.core import parallel_state

    from tests.unit.test_trained_rows import grpo_rows, router_loss_plans

    worker.scheduler = None
    for group in worker.optimizer.param_groups:
        group["lr"] = 0.0
    dp, rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    norms: dict[str, dict[str, float]] = {}
    for case, advantages in (("some", [0.0] * 4 + [1.0, -1.0, 0.5, -0.5]), ("none", [0.0] * 8)):
        plans = router_loss_plans(worker.cfg, dp, grpo_rows(data, advantages), worker.has_router_aux_loss())
        norms[case] = {
            name: worker.train(plan.shards[rank], **plan.kwargs)["grad_norm"].item() for name, plan in plans.items()
        }
    return norms


def odd_width(data: Any) -> Any:
    """``data`` cut to 15 positions (rows end by then)."""
    cut = data.copy()
    for key in ("input_ids", "token_mask"):
        cut[key] = data[key][:, :15]
    cut["input_lengths"] = data["input_lengths"].clamp(max=15)
    return cut


def forced_routing(data: Any) -> torch.Tensor:
    """``[B, S, layers, k]`` int16 expert choices unlike the model's own (distinct experts per token), -1 (no record:
    the model routes) at the first 3 positions of every row."""
    generator = torch.Generator().manual_seed(5)
    rows, width = data["input_ids"].shape
    routing = torch.stack([torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(rows * width * LAYERS)])
    routing = routing.reshape(rows, width, LAYERS, TOP_K).to(torch.int16)
    routing[:, :3] = -1
    return routing


@pytest.fixture(scope="module")
def model_dir() -> str:
    from nemo_rl_clone.models.huggingface import TINY_QWEN3_MOE, resolve_model_path

    return resolve_model_path(TINY_QWEN3_MOE)


@pytest.fixture(scope="module")
def batches() -> list:
    return make_batches()


@pytest.fixture(scope="module")
def run_dir(module_tmp_path: Path) -> Path:
    return module_tmp_path / "moe_run"


@pytest.fixture(scope="module")
def record(model_dir: str, run_dir: Path, batches: list) -> dict[str, Any]:
    return spawn(2, run_scenarios, model_dir, str(run_dir), batches, writes=run_dir)


def _checkpoint_tensors(model_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def test_ep2_logprobs_equal_hf(record: dict, model_dir: str, batches: list) -> None:
    expected = hf_logprobs(model_dir, batches[0])
    assert max_diff(record["ep2_logprobs"], expected) <= ATOL


def test_ep2_refit_state_is_the_checkpoint_layout_of_the_input_model(record: dict, model_dir: str) -> None:
    """Gathered over both EP ranks and named per expert as checkpoints (and vLLM) name them: bit-identical."""
    on_disk = _checkpoint_tensors(model_dir)
    state = record["init_state"]
    assert "model.layers.0.mlp.experts.7.up_proj.weight" in state
    assert state.keys() == on_disk.keys() - {"lm_head.weight"} or state.keys() == on_disk.keys()
    for name, tensor in state.items():
        assert torch.equal(tensor, on_disk.get(name, on_disk["model.embed_tokens.weight"])), name
    assert {name: info[0] for name, info in record["refit_info"].items()} == {n: t.shape for n, t in state.items()}


def test_ep2_trains_like_ep1(record: dict) -> None:
    for got, want in zip(record["ep2"], record["ep1"], strict=True):
        assert abs(got["loss"] - want["loss"]) <= ATOL
        assert abs(got["grad_norm"] - want["grad_norm"]) <= ATOL
        assert max_diff(got["state"], want["state"]) <= ATOL
    moved = max_diff(record["ep2"][-1]["state"], record["init_state"])
    assert moved > 1e-4  # the steps moved the weights (routers included: below)
    router = "model.layers.0.mlp.gate.weight"
    assert not torch.equal(record["ep2"][0]["state"][router], record["init_state"][router])


def test_tensor_and_sequence_parallel_with_experts_trains_like_ep1(record: dict, model_dir: str, batches: list) -> None:
    """TP=2 × EP=2 with sequence parallelism: HF's logprobs at an odd width (padded to split), EP=1's three steps.
    Without the norms' gradients summed over the TP ranks the weights were 2e-4 to 1.7e-3 off."""
    expected = hf_logprobs(model_dir, odd_width(batches[0]))
    assert max_diff(record["tp2_odd_width_logprobs"], expected) <= ATOL
    for got, want in zip(record["tp2"], record["ep1"], strict=True):
        assert abs(got["loss"] - want["loss"]) <= ATOL
        assert abs(got["grad_norm"] - want["grad_norm"]) <= ATOL
        assert max_diff(got["state"], want["state"]) <= ATOL


def test_weights_saved_at_ep2_load_at_ep1(record: dict) -> None:
    """Megatron's distributed checkpoint names experts globally: EP=1 loads all 8 from EP=2's two shares."""
    got, want = record["resumed_state"], record["ep2"][0]["state"]
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


@pytest.mark.parametrize(("resumed", "straight"), [("ep2_to_ep1", "ep2"), ("ep1_to_ep2", "ep1")])
def test_a_run_resumes_at_the_other_expert_parallel_size(record: dict, resumed: str, straight: str) -> None:
    """Steps 2-3 after resuming (weights, Adam moments and step count) equal the straight run's: an optimizer
    state reset (Adam's step count back to 0) moves the weights by 1.4e-4."""
    for got, want in zip(record[resumed], record[straight][1:], strict=True):
        assert abs(got["loss"] - want["loss"]) <= ATOL
        assert abs(got["grad_norm"] - want["grad_norm"]) <= ATOL
        assert max_diff(got["state"], want["state"]) <= ATOL


def test_hf_export_at_ep2_is_the_refit_state(record: dict, run_dir: Path) -> None:
    exported = _checkpoint_tensors(str(run_dir / "hf_step_1"))
    refit = record["ep2"][0]["state"]
    assert exported.keys() == refit.keys()
    for name, tensor in refit.items():
        assert torch.equal(exported[name], tensor), name


def test_frozen_router_keeps_its_weights(record: dict) -> None:
    assert record["frozen_requires_grad"] and not any(record["frozen_requires_grad"].values())
    state, init = record["frozen"]["state"], record["init_state"]
    for name in (n for n in init if n.endswith("mlp.gate.weight")):
        assert torch.equal(state[name], init[name]), name
    assert not torch.equal(
        state["model.layers.0.mlp.experts.0.down_proj.weight"], init["model.layers.0.mlp.experts.0.down_proj.weight"]
    )


def test_moe_keys_are_refused_by_name_for_moe_models_and_inert_for_dense_ones() -> None:
    import dataclasses

    from nemo_rl_clone.models.policy.megatron import moe
    from nemo_rl_clone.models.policy.megatron.config import MegatronConfig
    from nemo_rl_clone.utils.errors import UserInputError

    shape, dense = converter.model_shape(moe_config()), converter.model_shape(Qwen3Config(**DIMS))
    runs = MegatronConfig(moe_token_dispatcher_type="allgather", expert_model_parallel_size=2)
    moe.check(shape, runs, world_size=2)
    assert moe.notes(shape, runs) == [
        "policy.megatron_cfg.moe_permute_fusion: the fused token permutation needs Transformer Engine, and this "
        "backend builds Megatron's local (non-TE) layer spec; tokens are permuted unfused, the same result"
    ]
    refused = dataclasses.replace(
        runs, moe_grouped_gemm=True, moe_token_dispatcher_type="flex", tensor_model_parallel_size=2
    )
    moe.check(dense, dataclasses.replace(refused, expert_model_parallel_size=1), world_size=2)  # inert when dense
    with pytest.raises(UserInputError) as error:
        moe.check(shape, refused, world_size=2)
    assert [line.split(":")[0] for line in error.value.problems] == [
        "policy.megatron_cfg.moe_grouped_gemm",
        "policy.megatron_cfg.moe_token_dispatcher_type",
        "policy.megatron_cfg.sequence_parallel",  # MoE under TP needs it
    ]
    with pytest.raises(UserInputError, match=r"expert_model_parallel_size=2: expert parallelism splits experts, and"):
        moe.check(dense, runs, world_size=2)
    with pytest.raises(UserInputError, match=r"'allgather' over 2 expert ranks needs the same microbatch shapes"):
        moe.check(shape, runs, world_size=2, varying_shapes=True)
    if not torch.cuda.is_available():
        with pytest.raises(UserInputError, match=r"'alltoall' copies token counts on a CUDA stream"):
            moe.check(shape, dataclasses.replace(runs, moe_token_dispatcher_type="alltoall"), world_size=2)


def test_the_load_balancing_loss_trains_the_routers_when_configured(record: dict) -> None:
    """``moe_router_load_balancing_type: aux_loss`` with ``moe_aux_loss_coeff: 0.1``: the reported loss is the policy
    loss alone (Megatron adds the aux loss's gradient in the backward), and the gradient (router and, through the
    router's input, the layers below it) differs from the same step without it; a coefficient that does not reach
    Megatron fails this."""
    with_aux, without = record["aux_loss"], record["ep1"][0]
    assert abs(with_aux["loss"] - without["loss"]) <= ATOL
    assert abs(with_aux["grad_norm"] - without["grad_norm"]) > 1e-4
    routers = [name for name in without["state"] if name.endswith("mlp.gate.weight")]
    assert (
        routers and max_diff({n: with_aux["state"][n] for n in routers}, {n: without["state"][n] for n in routers}) > 0
    )


def test_with_the_load_balancing_loss_every_row_trains(record: dict) -> None:
    """The router loss runs over every row that runs, so with one (``aux_loss``, coefficient 0.1) `Policy.train`
    leaves no row out: the step's gradient norm (from the same weights) equals the one with skipping switched off to
    1e-6 relative (the same rows run; measured equal), with some zero-advantage rows and with only such rows. Leaving
    rows out anyway changes it by more than 1e-3 relative, so the check can tell (measured 1.977 vs 1.950, and 0.954
    vs 0.294: fewer microbatches also scale Megatron's aux-loss gradient up). lr 0 keeping the weights shows in
    the first two norms of each case being equal."""
    assert not record["ep1_has_router_aux_loss"]  # moe_router_load_balancing_type "none" (NeMo-RL's default)
    for case, norms in record["aux_loss_grad_norms"].items():
        assert norms["policy"] == pytest.approx(norms["every_row"], rel=1e-6, abs=0), case
        assert abs(norms["skipping"] - norms["every_row"]) > 1e-3 * norms["every_row"], case


def test_the_load_balancing_loss_is_on_only_for_an_moe_model_with_a_type_and_a_coefficient() -> None:
    import dataclasses

    from nemo_rl_clone.models.policy.megatron import moe
    from nemo_rl_clone.models.policy.megatron.config import MegatronConfig

    moe_shape, dense = converter.model_shape(moe_config()), converter.model_shape(Qwen3Config(**DIMS))
    on = MegatronConfig(moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.1)
    assert moe.adds_load_balancing_loss(moe_shape, on) and not moe.adds_load_balancing_loss(dense, on)
    for off in ({"moe_aux_loss_coeff": 0.0}, {"moe_router_load_balancing_type": "none"}):
        assert not moe.adds_load_balancing_loss(moe_shape, dataclasses.replace(on, **off))


def hf_forced_logprobs(model_dir: str, data: Any, routing: torch.Tensor) -> torch.Tensor:
    """Policy-layout logprobs of Hugging Face's model with ``routing`` forced by the DTensor worker's router hooks."""
    from nemo_rl_clone.models.policy.dtensor.moe import RoutingReplay

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    replay = RoutingReplay(model)  # its hooks read replay.routing: [B * S, layers, k] in HF's token order
    replay.routing = routing.reshape(-1, *routing.shape[2:])
    input_ids = data["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    next_token = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    logprobs = torch.cat([torch.zeros(len(input_ids), 1), next_token], dim=1)
    return torch.where(torch.arange(input_ids.shape[1]) < data["input_lengths"][:, None], logprobs, 0.0)


def test_router_replay_routes_each_token_to_the_recorded_experts(record: dict, model_dir: str, batches: list) -> None:
    """Megatron at EP=2 with a forced routing against Hugging Face with the same routing forced by the DTensor
    worker's router hooks (checked by hand in test_moe.py): equal to 1e-5. Megatron routes tokens in [S, B] order and
    HF in [B, S]: a record read in [B, S] order routes other tokens (measured gap 0.075); under sequence parallelism
    each TP rank reads its block of positions (all reading the first: 0.049). Without a record the
    model routes itself, bit-equal to a run without replay; the router still trains under a forced routing."""
    expected = hf_forced_logprobs(model_dir, batches[0], forced_routing(batches[0]))
    assert max_diff(record["replay_forced_logprobs"], expected) <= ATOL
    assert max_diff(record["replay_forced_logprobs"], record["ep2_logprobs"]) > 1e-2  # the routing mattered
    # TP=2 with sequence parallelism: each rank's routers see its half of the (padded) positions.
    expected = hf_forced_logprobs(model_dir, odd_width(batches[0]), forced_routing(batches[0])[:, :15])
    assert max_diff(record["tp2_replay_forced_logprobs"], expected) <= ATOL
    assert torch.equal(record["replay_unrecorded_logprobs"], record["ep2_logprobs"])
    router = "model.layers.1.mlp.gate.weight"
    assert not torch.equal(record["replay_step"]["state"][router], record["init_state"][router])

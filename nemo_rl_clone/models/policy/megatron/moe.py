"""Mixture-of-experts (Qwen3-MoE) in the Megatron backend: which ``policy.megatron_cfg`` MoE keys it implements,
which it refuses for an MoE model (and why), and the Megatron settings that route tokens exactly as Hugging Face's
Qwen3-MoE does.

Routing: Qwen3-MoE takes the softmax over all experts, keeps the top k and (``norm_topk_prob``) renormalises them to
sum to 1. Megatron's softmax router either takes the softmax first and keeps the top k (``moe_router_pre_softmax``:
Qwen3's rule without renormalising) or keeps the top-k logits and takes their softmax, which is the renormalised rule
(same experts, same weights up to rounding). Experts run in Megatron's ``SequentialMLP`` (one local-spec MLP per
expert): the grouped GEMM needs Transformer Engine or the grouped_gemm package.

The MoE keys stay inert on dense models (NeMo-RL's dense recipes set them); only expert parallelism is refused
there, since it would split nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec

from nemo_rl_clone.models.policy.megatron import converter
from nemo_rl_clone.utils.errors import UserInputError

DISPATCHERS = ("alltoall", "allgather")
ROUTER_DTYPES = (None, "fp32", "fp64")
# Load-balancing losses only add gradients; they leave the routing (and so the logprobs vLLM reproduces) as is.
LOAD_BALANCING_TYPES = ("none", "aux_loss", "seq_aux_loss", "global_aux_loss")

_KEY = "policy.megatron_cfg."
_NO_TE = "needs Transformer Engine, and this backend builds Megatron's local (non-TE) layer spec"
# (key, value that switches the feature off) → why a model with experts refuses anything else.
_REFUSED_FOR_MOE: dict[tuple[str, Any], str] = {
    ("moe_grouped_gemm", (None, False)): (
        f"the grouped expert GEMM {_NO_TE} (or the grouped_gemm package, not installed); the experts run one by "
        "one (SequentialMLP), the same result"
    ),
    ("moe_enable_deepep", (False,)): f"DeepEP's token dispatch {_NO_TE} and DeepEP",
    ("moe_flex_dispatcher_backend", (None,)): f"the flex token dispatcher {_NO_TE} and DeepEP or HybridEP",
    ("moe_router_enable_expert_bias", (None, False)): (
        "Megatron's aux-loss-free expert bias is for sigmoid routers, and Qwen3-MoE routes by softmax"
    ),
    ("moe_shared_expert_overlap", (False,)): "Qwen3-MoE has no shared experts to overlap",
    ("moe_per_layer_logging", (False,)): "per-layer MoE metrics are not reported by this backend yet",
}


def check(shape: converter.ModelShape, mcfg: Any, world_size: int, varying_shapes: bool = False) -> None:
    """Raise `UserInputError` (one line per problem, each naming its key) when ``mcfg`` cannot run this model.
    ``varying_shapes``: microbatch shapes differ between data-parallel ranks (dynamic batching, sequence packing)."""
    ep, etp = mcfg.expert_model_parallel_size, mcfg.expert_tensor_parallel_size
    if not shape.is_moe:
        for key, value in (("expert_model_parallel_size", ep), ("expert_tensor_parallel_size", etp)):
            if value != 1:
                raise UserInputError(f"{_KEY}{key}={value}: expert parallelism splits experts, and this model is dense")
        return
    problems = [
        f"{_KEY}{key}: not supported yet for MoE models: {reason}; set it to {_shown(off[-1])} (got {getattr(mcfg, key)!r})"
        for (key, off), reason in _REFUSED_FOR_MOE.items()
        if getattr(mcfg, key) not in off
    ]
    problems += _dispatcher_problems(mcfg, ep * etp, varying_shapes)
    if mcfg.moe_router_dtype not in ROUTER_DTYPES:
        problems.append(f"{_KEY}moe_router_dtype: must be one of {list(ROUTER_DTYPES)}, got {mcfg.moe_router_dtype!r}")
    if mcfg.moe_router_load_balancing_type not in LOAD_BALANCING_TYPES:
        problems.append(
            f"{_KEY}moe_router_load_balancing_type: must be one of {list(LOAD_BALANCING_TYPES)} (sinkhorn would "
            f"route unlike Qwen3-MoE, which vLLM serves), got {mcfg.moe_router_load_balancing_type!r}"
        )
    if mcfg.moe_aux_loss_coeff < 0:
        problems.append(f"{_KEY}moe_aux_loss_coeff: must be >= 0, got {mcfg.moe_aux_loss_coeff}")
    if mcfg.tensor_model_parallel_size > 1 and not mcfg.sequence_parallel:
        problems.append(
            f"{_KEY}sequence_parallel: Megatron trains MoE layers under tensor parallelism "
            f"(tensor_model_parallel_size={mcfg.tensor_model_parallel_size}) only with sequence parallelism; set it "
            "to true"
        )
    if shape.moe_topk == 1 and shape.norm_topk_prob:
        problems.append(
            f"{_KEY}converter_type: a top-1 Qwen3-MoE with norm_topk_prob has no Megatron router equivalent "
            "(Megatron's top-1 softmax router does not renormalise)"
        )
    if not problems:
        per_stage = world_size // mcfg.pipeline_model_parallel_size
        if per_stage % (ep * etp):
            problems.append(
                f"{_KEY}expert_model_parallel_size={ep} × expert_tensor_parallel_size={etp} must divide the "
                f"{per_stage} ranks of each pipeline stage"
            )
        try:
            converter.check_expert_parallel(shape, ep, etp)
        except ValueError as error:
            problems.append(str(error))
    if problems:
        raise UserInputError(*problems)


def _dispatcher_problems(mcfg: Any, expert_ranks: int, varying_shapes: bool) -> list[str]:
    """Why ``moe_token_dispatcher_type`` cannot run here (``expert_ranks``: expert × expert-tensor parallel size)."""
    if mcfg.moe_token_dispatcher_type == "alltoall" and not torch.cuda.is_available():
        return [
            f"{_KEY}moe_token_dispatcher_type: 'alltoall' copies token counts on a CUDA stream (Megatron's "
            "MoEAlltoAllTokenDispatcher); set 'allgather' on a machine without CUDA"
        ]
    if mcfg.moe_token_dispatcher_type not in DISPATCHERS:
        return [
            f"{_KEY}moe_token_dispatcher_type: must be one of {list(DISPATCHERS)} (flex {_NO_TE}), got "
            f"{mcfg.moe_token_dispatcher_type!r}"
        ]
    if mcfg.moe_token_dispatcher_type == "allgather" and mcfg.pipeline_model_parallel_size > 1:
        return [
            f"{_KEY}moe_token_dispatcher_type: 'allgather' needs fixed sequence lengths, which pipeline stages do not "
            "have here (microbatches differ in length); use 'alltoall'"
        ]
    if mcfg.moe_token_dispatcher_type == "allgather" and varying_shapes and expert_ranks > 1:
        # Its all-gather over the expert ranks (which are data-parallel ranks) assumes equal token counts.
        return [
            f"{_KEY}moe_token_dispatcher_type: 'allgather' over {expert_ranks} expert ranks needs the same microbatch "
            "shapes on every data-parallel rank; turn off policy.dynamic_batching / policy.sequence_packing, or use "
            "'alltoall' (CUDA)"
        ]
    return []


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


def adds_load_balancing_loss(shape: converter.ModelShape, mcfg: Any) -> bool:
    """Whether training adds a router load-balancing loss (Megatron applies one only with a coefficient > 0)."""
    return shape.is_moe and mcfg.moe_router_load_balancing_type != "none" and mcfg.moe_aux_loss_coeff > 0


def notes(shape: converter.ModelShape, mcfg: Any) -> list[str]:
    """Accepted MoE speed options without a kernel here, one log line each (the run computes the same result)."""
    if shape.is_moe and mcfg.moe_permute_fusion:
        return [
            f"{_KEY}moe_permute_fusion: the fused token permutation {_NO_TE}; tokens are permuted unfused, the same "
            "result"
        ]
    return []


def transformer_kwargs(shape: converter.ModelShape, mcfg: Any) -> dict[str, Any]:
    """`TransformerConfig` arguments for the model's attention extras and, for an MoE model, its experts."""
    kwargs: dict[str, Any] = {"qk_layernorm": shape.qk_layernorm}
    if not shape.is_moe:
        # Megatron checks a dense model's dispatcher against variable sequence lengths too.
        return kwargs | {"moe_token_dispatcher_type": "alltoall", "variable_seq_lengths": True}
    allgather = mcfg.moe_token_dispatcher_type == "allgather"
    return kwargs | {
        "num_moe_experts": shape.num_experts,
        "moe_ffn_hidden_size": shape.moe_ffn_hidden_size,
        "moe_router_topk": shape.moe_topk,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not shape.norm_topk_prob,  # see the module doc
        "moe_router_dtype": mcfg.moe_router_dtype,
        "moe_router_load_balancing_type": mcfg.moe_router_load_balancing_type,
        "moe_aux_loss_coeff": mcfg.moe_aux_loss_coeff,
        "moe_router_bias_update_rate": mcfg.moe_router_bias_update_rate,
        "moe_router_enable_expert_bias": False,
        "moe_token_dispatcher_type": mcfg.moe_token_dispatcher_type,
        "moe_grouped_gemm": False,
        "moe_permute_fusion": False,
        "expert_model_parallel_size": mcfg.expert_model_parallel_size,
        "expert_tensor_parallel_size": mcfg.expert_tensor_parallel_size,
        # allgather refuses variable lengths (it is refused with pipeline stages, the only ones that need them).
        "variable_seq_lengths": not allgather,
    }


def layer_spec(shape: converter.ModelShape) -> ModuleSpec:
    if shape.is_moe:
        _define_missing_te_names()
    return get_gpt_layer_local_spec(
        num_experts=shape.num_experts or None,
        moe_grouped_gemm=False,
        qk_layernorm=shape.qk_layernorm,
        normalization="RMSNorm",
    )


def _define_missing_te_names() -> None:
    """megatron-core 0.16's MoE utilities import Transformer Engine's kernels in a try block and then test them with
    ``te_general_gemm is not None``: without TE the names are undefined and the router's gating raises NameError.
    Defining them as None takes the plain torch path that test guards."""
    from megatron.core.transformer.moe import moe_utils

    for name in (
        "te_general_gemm",
        "fused_compute_score_for_moe_aux_loss",
        "fused_moe_aux_loss",
        "fused_permute",
        "fused_permute_with_probs",
        "fused_sort_chunks_by_index",
        "fused_sort_chunks_by_index_with_probs",
        "fused_topk_with_score_function",
        "fused_unpermute",
    ):
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)


def freeze_router(model: torch.nn.Module) -> int:
    """``freeze_moe_router``: the routers stop training (before DDP, which then gives them no gradient buffer, and
    the optimizer, which then has no state for them). Returns how many were frozen."""
    frozen = 0
    for name, param in model.named_parameters():
        if name.endswith("mlp.router.weight") or name.endswith("mlp.router.expert_bias"):
            param.requires_grad_(False)
            frozen += 1
    return frozen


class RoutingReplay:
    """``policy.router_replay`` on Megatron: each token goes to the experts the generation engine routed it to.

    Megatron's routers choose their top k through a ``router_replay`` object when one is set (Megatron's own
    `RouterReplay` replays whole layers and keeps every instance in a class-wide list); this one is set on each
    router of the stage and overrides only positions the batch has a record for (-1 keeps the model's choice). The
    weights are gathered from the router's own scores as Megatron's replay does (softmax over the chosen logits, the
    renormalised rule; or the full softmax's values with ``moe_router_pre_softmax``), so the router keeps its
    gradient. ``routing``: ``[B, S, layers, k]`` of the microbatch about to run (all layers, numbered globally).
    Under sequence parallelism a router sees its tensor-parallel rank's block of positions (``sequence_shard``:
    (rank, ranks))."""

    def __init__(self, model: torch.nn.Module, sequence_shard: tuple[int, int] = (0, 1)) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        routers = [module for module in model.modules() if isinstance(module, TopKRouter)]
        if not routers:
            raise UserInputError(
                "policy.router_replay.enabled: the model has no MoE router to replay; router replay is for MoE models"
            )
        self.routing: torch.Tensor | None = None
        self.shard_rank = sequence_shard[0]
        for router in routers:  # layer_number: global and 1-based, pipeline offset included
            router.router_replay = _LayerReplay(self, router.layer_number - 1)


class _LayerReplay:
    """What Megatron's ``topk_routing_with_score_function`` calls (``router_replay.get_replay_topk``) for one layer."""

    def __init__(self, replay: RoutingReplay, layer: int) -> None:
        self.replay, self.layer = replay, layer

    def get_replay_topk(
        self, scores: torch.Tensor, topk: int, num_groups: Any, group_topk: Any, default_compute_topk: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        routing = self.replay.routing
        if routing is None:
            return values, indices
        batch = routing.shape[0]
        seq = indices.shape[0] // batch  # this rank's positions: all, or its block under sequence parallelism
        start = self.replay.shard_rank * seq
        recorded = routing[:, start : start + seq, self.layer].to(indices.device, torch.long)
        if recorded.shape[1] < seq:  # the record stops at the last sampled token; later positions are padding
            recorded = torch.nn.functional.pad(recorded, (0, 0, 0, seq - recorded.shape[1]), value=-1)
        recorded = recorded.transpose(0, 1).reshape(-1, recorded.shape[-1])  # Megatron's token order: [S, B]
        if recorded.shape != indices.shape:
            raise RuntimeError(
                f"router replay: layer {self.layer} routes {tuple(indices.shape)} (tokens, k), the record holds "
                f"{tuple(recorded.shape)}"
            )
        chosen = torch.where(recorded >= 0, recorded, indices)
        return scores.gather(1, chosen), chosen

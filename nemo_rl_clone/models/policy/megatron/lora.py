"""LoRA on the Megatron backend (``megatron_cfg.peft``, the keys NeMo-RL's Megatron recipes write): only the adapters
train; the base weights stay frozen.

Each adapted linear layer of the decoder (``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2`` unless
``target_modules`` names others) keeps its weight and gains two parameters beside it, ``lora_A`` ``[dim, in]`` and
``lora_B`` ``[out, dim]``, and a forward hook that adds ``alpha / dim · B A x`` to its output (dropout on the input,
"pre", or on the update, "post"). ``lora_B`` starts at zero, so the model starts as the base model and the
reference weights the worker keeps are the base model's. Everything that leaves the worker in Hugging Face form
(refit, exports) is merged first, ``W + alpha / dim · B @ A`` (`merged_weights`). Checkpoints hold the whole model,
adapters included (Megatron's distributed format: they reload at any data- or pipeline-parallel layout).

Under tensor parallelism the adapters are sharded as their layer is. A column-parallel layer (``linear_qkv``,
``linear_fc1``: output rows split) keeps ``A`` whole and its rows of ``B``; a row-parallel one (``linear_proj``,
``linear_fc2``: input columns split) keeps its columns of ``A`` and ``B`` whole. Each computes what one process
would: the column case all-reduces the gradient of ``A x`` over the ranks (each saw its rows of ``B`` only), the
row case all-reduces ``A x`` itself (each saw its columns of ``x``). Under sequence parallelism the column case
gathers the split sequence first and the row case splits its update as the layer splits its output. ``A`` is drawn
whole and cut, so every layout starts from the same adapters; checkpoints store each sharded adapter by its global
layout (gate and up apart, as Megatron stores ``linear_fc1``), so they reload at any tensor-parallel size.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
from megatron.core.utils import make_tp_sharded_tensor_for_checkpoint
from torch import nn

from nemo_rl_clone.models.policy.dtensor.lora import matches_pattern, unmatched_pattern
from nemo_rl_clone.utils.errors import UserInputError

DEFAULT_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")  # every linear layer of a decoder layer
ADAPTER_INIT_SEED = 1234  # every rank and every rerun starts from the same adapters


def target_module_names(model: nn.Module, peft: Any) -> list[str]:
    """The decoder's linear layers that get an adapter (the output layer never does); raises `UserInputError` naming
    the key when a pattern matches nothing or an MoE expert would be adapted."""
    linear = [
        name
        for name, module in model.named_modules()
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)) and name.startswith("decoder.")
    ]
    unmatched = unmatched_pattern(linear, peft)
    if unmatched:
        examples = sorted({name.rsplit(".", 1)[-1] for name in linear})
        raise UserInputError(
            f"policy.megatron_cfg.peft.{unmatched[0]}: {unmatched[1]!r} matches no linear layer of the decoder; its "
            f"linear layers end in {examples}"
        )
    targets = list(peft.target_modules) or list(DEFAULT_TARGETS)
    chosen = [
        name
        for name in linear
        if any(matches_pattern(name, p) for p in targets)
        and not any(matches_pattern(name, p) for p in peft.exclude_modules)
    ]
    if any(".experts." in name for name in chosen):
        raise UserInputError("policy.megatron_cfg.peft.enabled: LoRA on MoE experts is not supported yet")
    if not chosen:
        raise UserInputError(
            "policy.megatron_cfg.peft.exclude_modules: excludes every targeted layer; nothing would train"
        )
    return chosen


def apply(model: nn.Module, peft: Any) -> list[str]:
    """Give ``model`` (one pipeline stage of a GPT model, before DDP wraps it) its adapters and freeze everything
    else; returns the adapted modules' names."""
    names = target_module_names(model, peft)
    scaling = peft.alpha / peft.dim
    modules = dict(model.named_modules())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ADAPTER_INIT_SEED)
        for name in names:
            _add_adapters(modules[name], name, peft.dim, scaling)
            hook = functools.partial(_add_update, dropout=peft.dropout, position=peft.dropout_position)
            modules[name].register_forward_hook(hook)
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith((".lora_A", ".lora_B")))
    return names


def _add_adapters(layer: Any, name: str, dim: int, scaling: float) -> None:
    """``lora_A`` (xavier, drawn at its whole shape, then this rank's columns for a row-parallel layer) and
    ``lora_B`` (zeros), each marked tensor-parallel where it is sharded (gradient norms count it on every rank) and
    stored by its global layout in checkpoints."""
    weight = layer.weight
    out_features, in_features = weight.shape
    column = isinstance(layer, ColumnParallelLinear)
    tp_size, tp_rank = layer.tp_group.size(), layer.tp_group.rank()
    whole_a = torch.empty(dim, in_features * (1 if column else tp_size), dtype=weight.dtype, device=weight.device)
    nn.init.xavier_normal_(whole_a)
    lora_a = nn.Parameter(whole_a if column else whole_a.chunk(tp_size, dim=1)[tp_rank].clone())
    lora_b = nn.Parameter(torch.zeros(out_features, dim, dtype=weight.dtype, device=weight.device))
    sharded, axis = (lora_b, 0) if column else (lora_a, 1)
    tensor_parallel.set_tensor_model_parallel_attributes(sharded, is_parallel=True, dim=axis, stride=1)
    layer.register_parameter("lora_A", lora_a)
    layer.register_parameter("lora_B", lora_b)
    layer.lora_scaling = scaling
    gated = column and name.endswith("linear_fc1") and layer.config.gated_linear_unit
    layer.sharded_state_dict = functools.partial(
        _sharded_state_dict, layer, layer.sharded_state_dict, "lora_B" if column else "lora_A", axis, gated
    )


def _sharded_state_dict(
    layer: Any,
    original: Any,
    adapter: str,
    axis: int,
    gated: bool,
    prefix: str = "",
    sharded_offsets: tuple = (),
    metadata: dict | None = None,
) -> dict[str, Any]:
    """The layer's own sharded state dict, with its sharded adapter split over the ranks as its weight is (Megatron's
    default would store it as replicated: rank 0's part only)."""
    state = original(prefix, sharded_offsets, metadata)
    key = f"{prefix}{adapter}"
    tensor = make_tp_sharded_tensor_for_checkpoint(
        getattr(layer, adapter), key, tp_axis=axis, prepend_offsets=sharded_offsets, tp_group=layer.tp_group
    )
    state[key] = apply_swiglu_sharded_factory(tensor, sharded_offsets) if gated else tensor
    return state


def _add_update(module: Any, args: tuple[Any, ...], output: Any, dropout: float, position: str) -> Any:
    """The layer's ``(output, bias)`` with the adapter's update added (inputs and outputs ``[S, B, features]``; under
    sequence parallelism S is this rank's part of the sequence, outside a column-parallel layer's output)."""
    x = args[0]
    if dropout and position == "pre":
        x = nn.functional.dropout(x, dropout, module.training)
    group, split = module.tp_group, module.sequence_parallel
    if group.size() == 1:
        update = nn.functional.linear(nn.functional.linear(x, module.lora_A), module.lora_B)
    elif isinstance(module, ColumnParallelLinear):
        if split:  # every rank computes A x over the whole sequence; its gradient is whole on each rank (below)
            x = tensor_parallel.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False, group=group)
        ax = tensor_parallel.copy_to_tensor_model_parallel_region(nn.functional.linear(x, module.lora_A), group=group)
        update = nn.functional.linear(ax, module.lora_B)
    else:
        ax = tensor_parallel.reduce_from_tensor_model_parallel_region(nn.functional.linear(x, module.lora_A), group)
        update = nn.functional.linear(ax, module.lora_B)
        if split:
            update = tensor_parallel.scatter_to_sequence_parallel_region(update, group=group)
    update = update * module.lora_scaling
    if dropout and position == "post":
        update = nn.functional.dropout(update, dropout, module.training)
    out, bias = output
    return out + update.to(out.dtype), bias


def merged_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{"<module>.weight": W + scaling · B @ A}`` (fp32 sums, cast back) for every adapted module of ``model``."""
    merged = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A"):
            weight = module.weight.detach()
            update = module.lora_scaling * (module.lora_B.detach().float() @ module.lora_A.detach().float())
            merged[f"{name}.weight"] = (weight.float() + update).to(weight.dtype)
    return merged


def is_adapter_key(name: str) -> bool:
    return name.endswith((".lora_A", ".lora_B"))

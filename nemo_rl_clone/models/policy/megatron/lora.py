"""LoRA on the Megatron backend (``megatron_cfg.peft``, the keys NeMo-RL's Megatron recipes write): only the adapters
train; the base weights stay frozen.

Each adapted linear layer of the decoder (``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2`` unless
``target_modules`` names others) keeps its weight and gains two parameters beside it, ``lora_A`` ``[dim, in]`` and
``lora_B`` ``[out, dim]``, and a forward hook that adds ``alpha / dim · B A x`` to its output (dropout on the input,
"pre", or on the update, "post"). ``lora_B`` starts at zero, so the model starts as the base model and the
reference weights the worker keeps are the base model's. Everything that leaves the worker in Hugging Face form
(refit, exports) is merged first, ``W + alpha / dim · B @ A`` (`merged_weights`). Checkpoints hold the whole model,
adapters included (Megatron's distributed format: they reload at any data- or pipeline-parallel layout).

One tensor-parallel rank only (validation): a sharded layer would need its adapters sharded alike.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
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
            layer = modules[name]
            out_features, in_features = layer.weight.shape
            weight = layer.weight
            lora_a = nn.Parameter(torch.empty(peft.dim, in_features, dtype=weight.dtype, device=weight.device))
            nn.init.xavier_normal_(lora_a)
            lora_b = nn.Parameter(torch.zeros(out_features, peft.dim, dtype=weight.dtype, device=weight.device))
            layer.register_parameter("lora_A", lora_a)
            layer.register_parameter("lora_B", lora_b)
            layer.lora_scaling = scaling
            hook = functools.partial(_add_update, dropout=peft.dropout, position=peft.dropout_position)
            layer.register_forward_hook(hook)
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith((".lora_A", ".lora_B")))
    return names


def _add_update(module: Any, args: tuple[Any, ...], output: Any, dropout: float, position: str) -> Any:
    """The layer's ``(output, bias)`` with the adapter's update added (inputs and outputs ``[S, B, features]``)."""
    x = args[0]
    if dropout and position == "pre":
        x = nn.functional.dropout(x, dropout, module.training)
    update = nn.functional.linear(nn.functional.linear(x, module.lora_A), module.lora_B) * module.lora_scaling
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

"""The DTensor policy's weights as others read them: the full Hugging Face state dict (export, refit), the engines'
checkpoint layout, and what a DCP checkpoint holds."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from nemo_rl_clone.models.hf_export import to_checkpoint_layout
from nemo_rl_clone.models.policy.config import LoraConfig
from nemo_rl_clone.models.policy.dtensor import lora
from nemo_rl_clone.models.policy.dtensor import parallel as dtensor_parallel


def refit_info(model: nn.Module, lora_cfg: LoraConfig | None, dtype: torch.dtype) -> dict[str, Any]:
    """``{hf_name: (full shape, dtype)}`` of what `for_engines` returns, from the local module alone (no collective):
    shapes go through the layout conversion as meta tensors."""
    state = model.state_dict()
    if lora_cfg is not None:  # what the engines get is merged, under the base model's names
        state = {lora.base_name(name): t for name, t in state.items() if not lora.is_adapter_key(name)}
    shapes = {name: torch.empty(tensor.shape, dtype=tensor.dtype, device="meta") for name, tensor in state.items()}
    return {
        name: (tensor.shape, dtype if tensor.is_floating_point() else tensor.dtype)
        for name, tensor in to_checkpoint_layout(model, shapes).items()
    }


def full_state_dict(model: nn.Module, lora_cfg: LoraConfig | None) -> dict[str, torch.Tensor]:
    """The whole model under its in-memory Hugging Face names on rank 0 (empty elsewhere), on CPU; with LoRA, the
    adapters merged in. A collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    with dtensor_parallel.quiet_redistribute_warnings():
        state = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    return lora.merged_state_dict(state, lora_cfg.scaling) if lora_cfg is not None else state


def for_engines(model: nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`full_state_dict` as generation engines load it: the checkpoint layout (per-expert MoE weights), cast to the
    compute ``dtype``."""
    state = to_checkpoint_layout(model, state)
    return {name: tensor.to(dtype) if tensor.is_floating_point() else tensor for name, tensor in state.items()}


def checkpoint_model_state(model: nn.Module, lora_cfg: LoraConfig | None) -> dict[str, Any]:
    """What a checkpoint holds of the model: everything, or with LoRA only the adapters (the frozen base weights come
    from the model path; torch's ignore_frozen_params would still keep a tied LM head)."""
    state = get_model_state_dict(model)
    return {k: v for k, v in state.items() if lora.is_adapter_key(k)} if lora_cfg is not None else state

"""LoRA adapters (peft) on a Hugging Face causal LM: only the adapters train; the base weights stay frozen.

The policy worker calls `apply` before FSDP wraps the model. peft replaces each adapted ``nn.Linear`` in place by a
``lora.Linear`` holding the frozen layer as ``base_layer`` and two small trainable layers, so parameter names gain
``.base_layer`` and ``.lora_A.default`` / ``.lora_B.default``. Everything that leaves the worker in Hugging Face
form (weights for the engines, consolidated exports) is *merged* first, ``W + alpha / dim · B @ A``, under the
model's own names (`merged_state_dict`); checkpoints hold the adapters only (`is_adapter_key`).

The reference model of GRPO's KL term and of DPO is the base model, i.e. this model with the adapters switched off
(`adapters_disabled`): no second copy of the weights is kept.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from nemo_rl_clone.models.policy.config import LoraConfig

ADAPTER_NAME = "default"  # peft's name for a model's only adapter
ADAPTER_INIT_SEED = 1234
_ADAPTER_PARTS = (f".lora_A.{ADAPTER_NAME}.", f".lora_B.{ADAPTER_NAME}.")
_BASE_LAYER = ".base_layer."
PEFT_ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file names for an adapter folder
PEFT_ADAPTER_CONFIG = "adapter_config.json"


class LoraTargetError(ValueError):
    """``lora_cfg.target_modules`` / ``exclude_modules`` select no layer, or name one that cannot carry an adapter."""


def matches_pattern(name: str, pattern: str) -> bool:
    """A pattern with wildcards (``*``, ``?``, ``[``) matches the full module name (``model.layers.*.mlp.*``);
    a plain one matches the name or its last dotted parts (``q_proj``, ``self_attn.q_proj``)."""
    if any(char in pattern for char in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern or name.endswith(f".{pattern}")


def unmatched_pattern(names: list[str], config: Any) -> tuple[str, str] | None:
    """The first ``(key, pattern)`` of ``config.target_modules`` / ``exclude_modules`` that matches none of
    ``names`` (None: each matches some); `matches_pattern`'s rules. The Megatron backend's peft keys too."""
    for key in ("target_modules", "exclude_modules"):
        for pattern in getattr(config, key):
            if not any(matches_pattern(name, pattern) for name in names):
                return key, pattern
    return None


def target_module_names(model: nn.Module, config: LoraConfig) -> list[str]:
    """Full names of the ``nn.Linear`` modules that get an adapter: every linear layer except the output head
    (``match_all_linear``, or no ``target_modules`` but some ``exclude_modules``) or those matching
    ``target_modules``, minus those matching ``exclude_modules``.

    Raises:
        LoraTargetError: a ``target_modules`` / ``exclude_modules`` pattern matches no linear layer, or nothing
            is left to adapt.
    """
    output_embeddings = getattr(model, "get_output_embeddings", None)
    head = output_embeddings() if callable(output_embeddings) else None
    linear = [name for name, module in model.named_modules() if isinstance(module, nn.Linear) and module is not head]
    unmatched = unmatched_pattern(linear, config)
    if unmatched:
        examples = sorted({name.rsplit(".", 1)[-1] for name in linear})
        raise LoraTargetError(
            f"policy.dtensor_cfg.lora_cfg.{unmatched[0]}: {unmatched[1]!r} matches no linear layer of "
            f"{type(model).__name__} (the output head excluded); its linear layers end in {examples}"
        )
    if not config.match_all_linear and config.target_modules:  # none named + exclusions: all but those (Automodel)
        linear = [name for name in linear if any(matches_pattern(name, p) for p in config.target_modules)]
    chosen = [name for name in linear if not any(matches_pattern(name, p) for p in config.exclude_modules)]
    if not chosen:
        raise LoraTargetError(
            "policy.dtensor_cfg.lora_cfg.exclude_modules: excludes every targeted linear layer; nothing would train"
        )
    return chosen


def apply(model: nn.Module, config: LoraConfig) -> list[str]:
    """Give ``model`` LoRA adapters in place (see `target_module_names`) and freeze everything else; returns the
    adapted modules' names. ``lora_B`` starts at zero, so the model computes exactly what it did before."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    names = target_module_names(model, config)
    peft_config = PeftLoraConfig(
        r=config.dim,
        lora_alpha=config.alpha,
        # peft drops the adapter's input ("pre"); validation allows "post" only with dropout 0, where both are equal.
        lora_dropout=config.dropout if config.dropout_position == "pre" else 0.0,
        target_modules=names,  # full names: peft matches them exactly
        bias="none",
    )
    # A fixed seed: every rank must start from the same adapters (each builds the whole model before FSDP shards
    # it), and a run must start from the same ones as its rerun.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ADAPTER_INIT_SEED)
        inject_adapter_in_model(peft_config, model, adapter_name=ADAPTER_NAME)  # lora_A: peft's kaiming-uniform
        if config.lora_A_init == "xavier":
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if _ADAPTER_PARTS[0] in name:
                        nn.init.xavier_normal_(param)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_key(name))
    return names


def is_adapter_key(name: str) -> bool:
    """Whether a parameter / state-dict key belongs to an adapter (``...lora_A.default.weight``)."""
    return any(part in name for part in _ADAPTER_PARTS)


def adapted_modules(adapters: Mapping[str, torch.Tensor]) -> list[str]:
    """The module names that ``adapters`` (keys ``<module>.lora_A.default.weight`` ...) hold an adapter for, sorted."""
    return sorted({key.split(_ADAPTER_PARTS[0])[0] for key in adapters if _ADAPTER_PARTS[0] in key})


def base_name(name: str) -> str:
    """The Hugging Face name of a base-model key: ``...q_proj.base_layer.weight`` → ``...q_proj.weight``."""
    return name.replace(_BASE_LAYER, ".")


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base model (adapters bypassed, their weights untouched) inside the block."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)  # also makes the adapters trainable again


def merge_adapters(
    base: Mapping[str, torch.Tensor], adapters: Mapping[str, torch.Tensor], scaling: float
) -> dict[str, torch.Tensor]:
    """``base`` (Hugging Face names) with every adapter folded in: ``W ← W + scaling · B @ A`` in fp32, cast back.

    ``adapters`` holds ``<module>.lora_A.default.weight`` ``[dim, in]`` and ``<module>.lora_B.default.weight``
    ``[out, dim]`` pairs, whose ``<module>.weight`` ``[out, in]`` must be in ``base``.
    """
    merged = dict(base)
    for module in adapted_modules(adapters):
        weight_key = f"{module}.weight"
        if weight_key not in merged:
            raise KeyError(f"adapter {module!r} has no base weight {weight_key!r} to merge into")
        a = adapters[f"{module}.lora_A.{ADAPTER_NAME}.weight"].float()
        b = adapters[f"{module}.lora_B.{ADAPTER_NAME}.weight"].float()
        weight = merged[weight_key]
        merged[weight_key] = (weight.float() + scaling * (b @ a)).to(weight.dtype)
    return merged


def merged_state_dict(state: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A LoRA model's full state dict (peft names) as the merged Hugging Face state dict the base model loads."""
    base = {base_name(key): value for key, value in state.items() if not is_adapter_key(key)}
    adapters = {key: value for key, value in state.items() if is_adapter_key(key)}
    return merge_adapters(base, adapters, scaling)


def save_peft_adapter(
    adapters: Mapping[str, torch.Tensor], config: LoraConfig, base_model: str, out_dir: str | Path
) -> Path:
    """Write ``adapters`` as a peft adapter folder (``adapter_model.safetensors`` + ``adapter_config.json``) that
    ``peft.PeftModel.from_pretrained(<base model>, out_dir)`` loads; ``base_model`` is recorded in the config."""
    from peft import LoraConfig as PeftLoraConfig
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    modules = adapted_modules(adapters)
    if not modules:
        raise ValueError("no LoRA adapter weights to save (keys ending in lora_A.default.weight)")
    # peft's saved layout: the PeftModel prefix, no adapter name.
    weights = {
        "base_model.model." + key.replace(f".{ADAPTER_NAME}.", "."): value.contiguous()
        for key, value in adapters.items()
    }
    save_file(weights, str(out_dir / PEFT_ADAPTER_WEIGHTS), metadata={"format": "pt"})
    peft_config = PeftLoraConfig(
        r=config.dim,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=modules,
        bias="none",
        base_model_name_or_path=base_model,
        task_type="CAUSAL_LM",
    )
    peft_config.save_pretrained(str(out_dir))
    return out_dir


def run_lora_config(policy_cfg: Mapping[str, Any]) -> LoraConfig | None:
    """A saved run's ``policy.dtensor_cfg.lora_cfg`` (the ``policy`` section of its ``config.yaml``), or None when
    the run trained without LoRA."""
    from nemo_rl_clone.models.policy.config import LoraConfig
    from nemo_rl_clone.utils.config_validation import validate_config

    raw = (policy_cfg.get("dtensor_cfg") or {}).get("lora_cfg") or {}
    return validate_config(raw, LoraConfig) if raw.get("enabled") else None


def checkpoint_state_dict(
    weights_dir: str | Path, policy_cfg: Mapping[str, Any], model_path: str
) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict of a DTensor checkpoint's ``policy/weights``: as saved, or for a LoRA run (see
    `run_lora_config`) the base model at ``model_path`` (a folder or hub id) with the saved adapters merged in."""
    from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict, load_hf_state_dict

    saved = load_dcp_model_state_dict(weights_dir)
    config = run_lora_config(policy_cfg)
    if config is None:
        return saved
    if not Path(model_path).is_dir():  # a hub id: its weight files, from the local cache when they are there
        from huggingface_hub import snapshot_download

        model_path = snapshot_download(model_path, allow_patterns=["*.safetensors", "*.bin", "*.json"])
    return merge_adapters(load_hf_state_dict(model_path), saved, config.scaling)

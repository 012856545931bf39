"""NeMo Automodel's model-building options (``policy.dtensor_cfg.automodel_kwargs``), on this DTensor path.

Models here always load as Hugging Face transformers' implementation. So an option is honoured where it names
what that implementation already does (``force_hf: true``, ``backend.attn: sdpa``, ``backend.linear: torch``, ...)
or something this path does itself (``attn_implementation``, ``freeze_config``); an option that asks for another
kernel or one of Automodel's own model implementations (Transformer Engine layers, grouped-GEMM experts, DeepEP,
Liger) is refused by name, before anything starts.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the config validates without torch loaded
    import torch

BACKEND_TARGET = "nemo_automodel.components.models.common.utils.BackendConfig"
HF_ATTENTIONS = ("sdpa", "eager")

# Backend fields and the values that describe the Hugging Face implementation run here (its SDPA attention,
# torch.nn.Linear, its RMSNorm, which normalises in fp32 whatever the compute dtype, per-expert loops over
# torch collectives, weights under Hugging Face names); anything else is another kernel, not built here.
_BACKEND_ACCEPTED: dict[str, tuple[Any, ...]] = {
    "attn": ("sdpa",),
    "linear": ("torch",),
    "rms_norm": ("torch", "torch_fp32"),
    "experts": ("torch",),
    "dispatcher": ("torch",),
    "enable_deepep": (False,),
    "fake_balanced_gate": (False,),
    "enable_hf_state_dict_adapter": (True,),
    "rope_fusion": (False,),
    "enable_fsdp_optimizations": (False,),
    "gate_precision": (None,),
}
# Top-level flags whose only value here is the one that asks for nothing this path lacks.
_FLAGS_ACCEPTED: dict[str, tuple[bool, str]] = {
    "force_hf": (True, "Automodel's own model implementations are not built here; models load as Hugging Face's"),
    "use_liger_kernel": (False, "Liger's Triton kernels are not built here"),
    "use_sdpa_patching": (False, "Automodel's SDPA backend patching is not built here"),
}
# freeze_config: Automodel's defaults, and what marks each part: the model attribute, then substrings of
# lower-cased module names (a vision-language model's towers under other names).
FREEZE_PARTS: dict[str, tuple[bool, str, tuple[str, ...]]] = {
    "freeze_vision_tower": (True, "vision_tower", ("vision", "visual", "image_encoder")),
    "freeze_audio_tower": (False, "audio_tower", ("audio", "speech", "sound")),
    "freeze_language_model": (False, "language_model", ("language", "text", "llm")),
}


def check(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key under ``automodel_kwargs``, problem) for every option this path does not honour."""
    problems: list[tuple[str, str]] = []
    for key, value in options.items():
        if key in _FLAGS_ACCEPTED:
            accepted, why = _FLAGS_ACCEPTED[key]
            if value is not accepted:
                problems.append((key, f"not supported yet: {why}; set it to {str(accepted).lower()}"))
        elif key == "attn_implementation":
            if value not in HF_ATTENTIONS:
                problems.append((key, f"not supported yet: {value!r}; use one of {list(HF_ATTENTIONS)}"))
        elif key == "backend":
            problems += _check_backend(value)
        elif key == "freeze_config":
            problems += _check_freeze_config(value)
        else:
            problems.append((key, f"not supported yet: Automodel option {key!r}"))
    return problems


def _check_backend(backend: Any) -> list[tuple[str, str]]:
    if backend is None:
        return []
    if not isinstance(backend, Mapping):
        return [("backend", f"must be a mapping of Automodel's BackendConfig fields, got {backend!r}")]
    problems = []
    for field, value in backend.items():
        if field == "_target_":
            if value != BACKEND_TARGET:
                problems.append((f"backend.{field}", f"not supported yet: {value!r}; only {BACKEND_TARGET}"))
        elif field not in _BACKEND_ACCEPTED:
            problems.append((f"backend.{field}", f"not supported yet: Automodel backend field {field!r}"))
        elif value not in _BACKEND_ACCEPTED[field]:
            accepted = ", ".join(repr(v) if isinstance(v, str) else str(v).lower() for v in _BACKEND_ACCEPTED[field])
            problems.append(
                (
                    f"backend.{field}",
                    f"not supported yet: {value!r}; models run Hugging Face's implementation here ({accepted})",
                )
            )
    return problems


def _check_freeze_config(freeze: Any) -> list[tuple[str, str]]:
    if freeze is None:
        return []
    if not isinstance(freeze, Mapping):
        return [("freeze_config", f"must be a mapping of {sorted(FREEZE_PARTS)} to booleans, got {freeze!r}")]
    problems = []
    for key, value in freeze.items():
        if key not in FREEZE_PARTS:
            problems.append((f"freeze_config.{key}", f"not supported yet: use {sorted(FREEZE_PARTS)}"))
        elif not isinstance(value, bool):
            problems.append((f"freeze_config.{key}", f"must be true or false, got {value!r}"))
    return problems


def hf_attention(options: Mapping[str, Any], default: str) -> str:
    """The Hugging Face attention kernel: ``automodel_kwargs.attn_implementation`` where given, else ``default``."""
    return str(options.get("attn_implementation") or default)


def freeze(model: torch.nn.Module, freeze_config: Mapping[str, bool] | None, rank: int = 0) -> dict[str, int]:
    """Set ``requires_grad=False`` on the parts ``freeze_config`` names (Automodel's defaults for unnamed ones);
    returns the number of parameters frozen per part. None: nothing. A part asked for that the model lacks is said
    in one line (a language model has no vision tower), never silently."""
    import torch

    if freeze_config is None:
        return {}
    frozen: dict[str, int] = {}
    for key, (default, attribute, name_parts) in FREEZE_PARTS.items():
        if not freeze_config.get(key, default):
            continue
        modules = [getattr(model, attribute)] if isinstance(getattr(model, attribute, None), torch.nn.Module) else []
        modules += [m for name, m in model.named_modules() if any(part in name.lower() for part in name_parts)]
        params = {id(p): p for module in modules for p in module.parameters()}
        for param in params.values():
            param.requires_grad_(False)
        frozen[key] = sum(p.numel() for p in params.values())
        if not params and rank == 0:
            print(
                f"dtensor_cfg.automodel_kwargs.freeze_config.{key}: the model has no such part "
                f"(attribute {attribute!r} or a module named {' / '.join(name_parts)}); nothing frozen",
                file=sys.stderr,
                flush=True,
            )
    return frozen

"""NeMo-RL's Megatron-to-Hugging Face converter (``nemo_rl.models.megatron.community_import``) with its signature, on
this library's Megatron export (`nemo_rl_clone.models.policy.megatron.export`).

NeMo-RL rebuilds the model from ``hf_model_name`` through Megatron-Bridge. Here it is rebuilt the way the policy
worker built it, so the run's saved ``config.yaml`` (its ``policy`` section: converter, precision, Megatron options)
is read from the checkpoint, one to three folders above ``input_path`` (``step_N/policy/weights``, or NeMo-RL's
``step_N/policy/weights/iter_N``); ``hf_model_name`` replaces its ``policy.model_name``. The export runs in this
process at tensor and pipeline parallel size 1 and joins (then leaves) a one-process group, as NeMo-RL's does: call it
from a process that has no process group.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from nemo_rl_clone.models.policy.megatron.export import export_megatron_checkpoint, single_process_policy
from nemo_rl_clone.utils.checkpoint import CONFIG_FILE, require_verified_weights
from nemo_rl_clone.utils.config import load_config, resolve_to_container
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

PathLike = str | os.PathLike[str]
# step_N/policy/weights[/iter_N]: the run's config.yaml is in step_N, two or three folders up.
CONFIG_SEARCH_DEPTH = 3


# NeMo-RL's dtype names, in any case (Megatron configs write pipeline_dtype either way).
_DTYPE_NAMES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def to_torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``dtype`` as a torch dtype: a torch dtype as is, or one of NeMo-RL's names (``fp32``/``float32``,
    ``bf16``/``bfloat16``, ``fp16``/``float16``, any case); anything else raises ``ValueError`` naming it."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.lower()]
    raise ValueError(f"Unknown dtype: {dtype!r} (expected a torch dtype or one of {', '.join(_DTYPE_NAMES)})")


def export_model_from_megatron(
    hf_model_name: str,
    input_path: PathLike,
    output_path: PathLike,
    hf_tokenizer_path: PathLike | None,
    overwrite: bool = False,
    hf_overrides: Mapping[str, Any] | None = {},  # NeMo-RL's default (a Mapping: only read)
    strict: bool = True,
) -> None:
    """Write the Megatron checkpoint at ``input_path`` as a Hugging Face folder (safetensors, the checkpoint's
    dtype) at ``output_path``, with the tokenizer of ``hf_tokenizer_path`` (None: the checkpoint's saved
    ``policy/tokenizer``, else ``hf_model_name``'s).

    ``strict`` is accepted for NeMo-RL's signature: the export here writes every tensor or stops naming the missing
    ones (NeMo-RL's ``strict=False`` saves partial shards for frozen modules of multimodal models, not built here).

    Raises:
        FileExistsError: ``output_path`` exists and ``overwrite`` is false (NeMo-RL's rule).
        UserInputError: no run ``config.yaml`` above ``input_path``, or ``hf_overrides`` given (the Megatron backend
            reads the model's own config).
        ConfigError: the saved policy section is not a Megatron-backend one (one line per problem).
    """
    weights = Path(input_path)
    out_dir = Path(output_path)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists; delete it or pass overwrite=True")
    if hf_overrides:
        raise UserInputError(
            "hf_overrides: not supported yet with the Megatron backend (its converter reads the model's own config)"
        )
    require_verified_weights(weights)  # a damaged checkpoint is named, not converted
    config_path, policy_section = _run_policy_section(weights)
    policy = single_process_policy({**policy_section, "model_name": str(hf_model_name)}, str(config_path))
    if hf_tokenizer_path is None:
        saved = _saved_tokenizer(weights)
        hf_tokenizer_path = saved if saved is not None else hf_model_name
    export_megatron_checkpoint(policy, weights, out_dir, str(hf_tokenizer_path), overwrite=overwrite)


def _run_policy_section(weights: Path) -> tuple[Path, dict[str, Any]]:
    """The run's ``config.yaml`` nearest above ``weights`` and its ``policy`` section."""
    for folder in weights.resolve().parents[:CONFIG_SEARCH_DEPTH]:
        config_path = folder / CONFIG_FILE
        if config_path.is_file():
            policy = resolve_to_container(load_config(config_path)).get("policy")
            if isinstance(policy, dict):
                return config_path, policy
    raise UserInputError(
        f"{weights}: no {CONFIG_FILE} with a policy section in the {CONFIG_SEARCH_DEPTH} folders above it; the "
        "Megatron export rebuilds the model the way the run did, from the checkpoint's step_N/config.yaml"
    )


def _saved_tokenizer(weights: Path) -> Path | None:
    for folder in weights.resolve().parents[:2]:  # step_N/policy (or, under iter_N, one folder higher)
        if (folder / "tokenizer").is_dir():
            return folder / "tokenizer"
    return None


# NeMo-RL writes a Megatron-Bridge checkpoint from Hugging Face weights before a run; here the Megatron policy
# converts the Hugging Face weights itself when it starts, and no pre-imported checkpoint is read
__getattr__ = refusing_getattr(
    __name__,
    {
        "import_model_from_hf_name": "importing a Hugging Face model into a Megatron checkpoint ahead of the run (the "
        "Megatron policy loads policy.model_name's Hugging Face weights itself)"
    },
)

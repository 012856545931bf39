"""NeMo-RL's `Policy` arguments that `nemo_rl_clone.models.policy.lm_policy.Policy` resolves into its own or
refuses by name."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.errors import UserInputError


def refuse_unbuilt_options(workers_per_node: Any, processor: Any, worker_extension_cls_fqn: Any) -> None:
    """NeMo-RL's `Policy` arguments for features not built here: each refused in one line unless None."""
    refused = {
        "workers_per_node": (workers_per_node, "fewer workers than the cluster's bundles (one worker per bundle)"),
        "processor": (processor, "vision and audio inputs (a multimodal processor)"),
        "worker_extension_cls_fqn": (worker_extension_cls_fqn, "worker extension classes"),
    }
    if problems := [f"Policy: {key}: not supported yet: {what}" for key, (v, what) in refused.items() if v is not None]:
        raise UserInputError(*problems)


def consolidated_folder(
    weights_path: str,
    checkpointing_cfg: CheckpointingConfig | Mapping[str, Any] | None,
    save_hf_path: str | None,
    save_hf_format: str,
) -> tuple[str | None, str]:
    """``(save_hf_path, save_hf_format)`` of `Policy.save_checkpoint`: NeMo-RL's ``checkpointing_cfg`` with
    ``save_consolidated`` asks for a Hugging Face folder, written as ``hf`` beside ``weights_path`` (the layout of
    this library's checkpoints) in its ``model_save_format``; an explicit ``save_hf_path`` wins."""
    if checkpointing_cfg is None or save_hf_path is not None:
        return save_hf_path, save_hf_format
    checkpointing = as_config(checkpointing_cfg, CheckpointingConfig, key="checkpointing")
    if not checkpointing.save_consolidated:
        return None, save_hf_format
    return str(Path(weights_path).parent / "hf"), checkpointing.model_save_format or save_hf_format

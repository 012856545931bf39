"""NeMo-RL's DCP checkpoint helpers (``nemo_rl.utils.native_checkpoint``, presented at
`nemo_rl_clone.utils.native_checkpoint`) with NeMo-RL's signatures, on this library's checkpoint layout.

The layout is the DTensor policy worker's: the model as ``{"model": <state dict with Hugging Face names>}`` under
``weights_path``; the optimizer as ``{"optim": ..., "scheduler": ...}`` under ``optimizer_path``. So a model saved with
`save_checkpoint` loads into the policy and converts with `convert_dcp_to_hf`, and a policy's checkpoint loads with
`load_checkpoint`. Paths may be ``str`` or ``pathlib.Path``. The conversion is `save_consolidated_hf` on
`load_dcp_model_state_dict`: one process, no process group, nothing else loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from nemo_rl_clone.utils.checkpoint import require_verified_weights

PathLike = str | os.PathLike[str]
# The policy worker's key for the scheduler state (NeMo-RL's OptimizerState says "sched").
SCHEDULER_KEY = "scheduler"


class ModelState(Stateful):
    """A model as DCP saves and loads it: its state dict (sharded tensors stay sharded), offloaded to the CPU."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model, options=StateDictOptions(cpu_offload=True))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state_dict)


class OptimizerState(Stateful):
    """An optimizer (and its learning-rate scheduler, when given) as DCP saves and loads it."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        options = StateDictOptions(cpu_offload=True)
        state: dict[str, Any] = {"optim": get_optimizer_state_dict(self.model, self.optimizer, options=options)}
        if self.scheduler is not None:
            state[SCHEDULER_KEY] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict["optim"])
        if self.scheduler is not None and SCHEDULER_KEY in state_dict:
            self.scheduler.load_state_dict(state_dict[SCHEDULER_KEY])


def save_checkpoint(
    model: torch.nn.Module,
    weights_path: PathLike,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    optimizer_path: PathLike | None = None,
    tokenizer: Any | None = None,
    tokenizer_path: PathLike | None = None,
) -> None:
    """Save ``model`` (and ``optimizer`` with ``scheduler``, ``tokenizer``) in the policy's checkpoint layout.

    Raises:
        ValueError: ``optimizer`` without ``optimizer_path`` or ``tokenizer`` without ``tokenizer_path``, before
            anything is written (NeMo-RL raises after saving the weights).
    """
    _require_path_with(optimizer, optimizer_path, "optimizer")
    _require_path_with(tokenizer, tokenizer_path, "tokenizer")
    dcp.save({"model": ModelState(model)}, checkpoint_id=weights_path)
    if optimizer is not None:
        dcp.save(OptimizerState(model, optimizer, scheduler).state_dict(), checkpoint_id=optimizer_path)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tokenizer_path))


def load_checkpoint(
    model: torch.nn.Module,
    weights_path: PathLike,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    optimizer_path: PathLike | None = None,
) -> None:
    """Load the weights at ``weights_path`` into ``model`` (and ``optimizer_path`` into ``optimizer`` and
    ``scheduler``); ``model`` may be sharded differently from the one that saved them."""
    _require_path_with(optimizer, optimizer_path, "optimizer")
    dcp.load({"model": ModelState(model)}, checkpoint_id=weights_path)
    if optimizer is not None:
        state = OptimizerState(model, optimizer, scheduler)
        saved = state.state_dict()
        dcp.load(saved, checkpoint_id=optimizer_path)
        state.load_state_dict(saved)


def _require_path_with(thing: Any | None, path: PathLike | None, name: str) -> None:
    if thing is not None and path is None:
        raise ValueError(f"{name}_path must be given with {name}")


def convert_dcp_to_hf(
    dcp_ckpt_path: PathLike,
    hf_ckpt_path: PathLike,
    model_name_or_path: str,
    tokenizer_name_or_path: str | None,
    overwrite: bool = False,
    hf_overrides: Mapping[str, Any] | None = {},  # NeMo-RL's default (a Mapping: only read)
) -> PathLike:
    """Write the DCP weights at ``dcp_ckpt_path`` (``step_N/policy/weights``) as a Hugging Face folder at
    ``hf_ckpt_path`` (``pytorch_model.bin`` in the saved dtype, ``config.json`` of ``model_name_or_path`` with
    ``hf_overrides`` applied, the tokenizer of ``tokenizer_name_or_path``, default the model's). Returns
    ``hf_ckpt_path`` as given.

    Raises:
        FileExistsError: ``hf_ckpt_path`` exists and ``overwrite`` is false (NeMo-RL's rule).
        FileNotFoundError: ``dcp_ckpt_path`` is no DCP checkpoint.
        ValueError: the saved weights do not fit the model's config (the keys or shapes are named).
    """
    from transformers import AutoConfig

    from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict, save_consolidated_hf
    from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path

    out_dir = Path(hf_ckpt_path)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists; delete it or pass overwrite=True")
    require_verified_weights(Path(dcp_ckpt_path))  # a damaged checkpoint is named, not converted
    state_dict = load_dcp_model_state_dict(dcp_ckpt_path)
    model_config = AutoConfig.from_pretrained(resolve_model_path(str(model_name_or_path)), **dict(hf_overrides or {}))
    tokenizer = load_tokenizer(str(tokenizer_name_or_path or model_name_or_path))
    save_consolidated_hf(
        state_dict, model_config, out_dir, tokenizer=tokenizer, overwrite=True, save_format="torch_save"
    )
    return hf_ckpt_path

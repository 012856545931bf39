"""Collate functions: a list of :class:`DatumSpec` → one :class:`BatchedDataDict` (for the dataloaders)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nemo_rl_clone.data.interfaces import DatumSpec
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict

_RL_KEYS = ("message_log", "length", "extra_env_info", "loss_multiplier", "idx", "task_name")
_EVAL_KEYS = ("message_log", "extra_env_info", "idx", "task_name")


def rl_collate_fn(data_batch: Sequence[DatumSpec]) -> BatchedDataDict:
    """Collate RL prompts.

    Returns a batch of size B with lists ``message_log``, ``extra_env_info``, ``idx``, ``task_name``,
    ``stop_strings`` (``None`` where a sample has none), and tensors ``length`` (long ``[B]``),
    ``loss_multiplier`` (float ``[B]``) and ``batch_max_length`` (long ``[B]``, the batch's longest prompt
    repeated, kept per sample so it survives sharding).
    """
    _check_keys(data_batch, _RL_KEYS, "rl_collate_fn")
    lengths = torch.tensor([datum["length"] for datum in data_batch], dtype=torch.long)
    return BatchedDataDict(
        message_log=[datum["message_log"] for datum in data_batch],
        length=lengths,
        loss_multiplier=torch.tensor([float(datum["loss_multiplier"]) for datum in data_batch], dtype=torch.float32),
        extra_env_info=[datum["extra_env_info"] for datum in data_batch],
        idx=[datum["idx"] for datum in data_batch],
        task_name=[datum["task_name"] for datum in data_batch],
        stop_strings=[datum.get("stop_strings") for datum in data_batch],
        batch_max_length=torch.full_like(lengths, int(lengths.max())),
    )


def eval_collate_fn(data_batch: Sequence[DatumSpec]) -> BatchedDataDict:
    """Collate evaluation prompts: lists ``message_log``, ``extra_env_info``, ``idx``, ``task_name``,
    ``stop_strings``."""
    _check_keys(data_batch, _EVAL_KEYS, "eval_collate_fn")
    return BatchedDataDict(
        message_log=[datum["message_log"] for datum in data_batch],
        extra_env_info=[datum["extra_env_info"] for datum in data_batch],
        idx=[datum["idx"] for datum in data_batch],
        task_name=[datum["task_name"] for datum in data_batch],
        stop_strings=[datum.get("stop_strings") for datum in data_batch],
    )


def _check_keys(data_batch: Sequence[DatumSpec], keys: Sequence[str], caller: str) -> None:
    if not data_batch:
        raise ValueError(f"{caller}: got an empty batch")
    for i, datum in enumerate(data_batch):
        missing = [key for key in keys if key not in datum]
        if missing:
            raise KeyError(f"{caller}: sample {i} lacks {missing}; DatumSpec needs {list(keys)}")

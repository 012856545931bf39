"""Collate functions: a list of :class:`DatumSpec` → one :class:`BatchedDataDict` (for the dataloaders)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.data.interfaces import DatumSpec, PreferenceDatumSpec
from nemo_rl_clone.data.llm_message_utils import add_loss_mask_to_message_log, batched_message_log_to_flat_message
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict

TokenizerType = PreTrainedTokenizerBase  # NeMo-RL's name

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


def preference_collate_fn(
    data_batch: Sequence[PreferenceDatumSpec],
    tokenizer: TokenizerType,
    make_sequence_length_divisible_by: int,
    add_loss_mask: bool,
) -> BatchedDataDict:
    """Collate preference pairs into 2B rows, chosen and rejected interleaved (row 2i: pair i's chosen).

    Returns ``input_ids`` [2B, S] (right-padded with the tokenizer's pad token, S a multiple of
    ``make_sequence_length_divisible_by``), ``input_lengths`` [2B] and ``sample_mask`` [2B] (each pair's
    ``loss_multiplier`` twice); with ``add_loss_mask``, also ``token_mask`` [2B, S]: 1 on the last message of each
    row (the answer), written into the message logs as ``token_loss_mask``.
    """
    if not data_batch:
        raise ValueError("preference_collate_fn: got an empty batch")
    message_logs = [log for datum in data_batch for log in (datum["message_log_chosen"], datum["message_log_rejected"])]
    if add_loss_mask:
        add_loss_mask_to_message_log(message_logs, only_unmask_final=True)
    flat, input_lengths = batched_message_log_to_flat_message(
        message_logs, {"token_ids": tokenizer.pad_token_id, "token_loss_mask": 0}, make_sequence_length_divisible_by
    )
    batch = BatchedDataDict(
        input_ids=flat["token_ids"],
        input_lengths=input_lengths,
        sample_mask=torch.tensor([float(d["loss_multiplier"]) for d in data_batch for _ in (0, 1)]),
    )
    if add_loss_mask:
        batch["token_mask"] = flat["token_loss_mask"]
    return batch


def _check_keys(data_batch: Sequence[DatumSpec], keys: Sequence[str], caller: str) -> None:
    if not data_batch:
        raise ValueError(f"{caller}: got an empty batch")
    for i, datum in enumerate(data_batch):
        missing = [key for key in keys if key not in datum]
        if missing:
            raise KeyError(f"{caller}: sample {i} lacks {missing}; DatumSpec needs {list(keys)}")

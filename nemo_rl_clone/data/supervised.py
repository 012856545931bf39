"""Supervised data (SFT, DPO, reward models): chat rows → tokenised datums → padded training batches.

An SFT datum templates the whole conversation once (:func:`get_formatted_message_log`, so the tokens equal
``tokenizer.apply_chat_template(messages)``) and trains on every assistant message. A preference datum templates
``context + chosen`` and ``context + rejected`` and trains only on the answer (the messages after the context).
A datum longer than ``max_seq_length`` is truncated so the data keeps flowing, and gets ``loss_multiplier = 0``;
a truncated answer of a pair masks both rows of that pair.

Loaders live in :mod:`nemo_rl_clone.data.datasets.sft` / ``.preference`` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import datasets
import torch
import torch.utils.data
from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.data.config import SupervisedDataConfig
from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import LoadedDataset, Rows
from nemo_rl_clone.data.datasets.preference import PREFERENCE_DATASET_NAMES, load_preference_dataset
from nemo_rl_clone.data.datasets.sft import SFT_DATASET_NAMES, load_sft_dataset
from nemo_rl_clone.data.interfaces import LLMMessageLogType, TaskDataSpec
from nemo_rl_clone.data.llm_message_utils import batched_message_log_to_flat_message, get_formatted_message_log
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict

__all__ = [
    "PREFERENCE_DATASET_NAMES",
    "SFT_DATASET_NAMES",
    "PreferenceDataset",
    "SFTDataset",
    "build_datasets",
    "build_preference_datum",
    "build_sft_datum",
    "load_preference_dataset",
    "load_sft_dataset",
    "preference_collate_fn",
    "sft_collate_fn",
]


def build_sft_datum(
    messages: Sequence[Mapping[str, str]],
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    idx: int,
    add_bos: bool = False,
    add_eos: bool = False,
    add_generation_prompt: bool = False,
    task_data_spec: TaskDataSpec | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """``{"message_log", "length", "loss_multiplier", "idx"}``; ``token_loss_mask`` is 1 on assistant messages.

    ``add_bos`` / ``add_eos`` (NeMo-RL's ``data.add_bos`` / ``data.add_eos``): start the conversation with the
    tokenizer's BOS token / end it with its EOS token when the chat template did not already (a tokenizer without
    that token is left as is). ``add_generation_prompt`` (``data.add_generation_prompt``): the assistant header
    before each reply is part of the user message, so it is not trained on (else it is the reply's first tokens).
    ``task_data_spec`` / ``tools``: as `get_formatted_message_log` takes them (NeMo-RL's ``sft_processor``)."""
    template = _Template(add_bos, add_eos, add_generation_prompt, task_data_spec, tools)
    message_log, length, truncated = _templated(messages, tokenizer, max_seq_length, None, template)
    return {"message_log": message_log, "length": length, "loss_multiplier": 0.0 if truncated else 1.0, "idx": idx}


def build_preference_datum(
    context: Sequence[Mapping[str, str]],
    chosen: Sequence[Mapping[str, str]],
    rejected: Sequence[Mapping[str, str]],
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    idx: int,
    add_bos: bool = False,
    add_eos: bool = False,
    task_data_spec: TaskDataSpec | None = None,
) -> dict[str, Any]:
    """``{"message_log_chosen", "message_log_rejected", "length_chosen", "length_rejected", "loss_multiplier",
    "idx"}``; ``token_loss_mask`` is 1 on the answer messages only (assistant turns inside the context are not
    trained on). ``add_bos`` / ``add_eos`` / ``task_data_spec``: as in `build_sft_datum`."""
    template = _Template(add_bos, add_eos, False, task_data_spec)
    log_chosen, len_chosen, cut_chosen = _templated(
        [*context, *chosen], tokenizer, max_seq_length, len(context), template
    )
    log_rejected, len_rejected, cut_rejected = _templated(
        [*context, *rejected], tokenizer, max_seq_length, len(context), template
    )
    return {
        "message_log_chosen": log_chosen,
        "message_log_rejected": log_rejected,
        "length_chosen": len_chosen,
        "length_rejected": len_rejected,
        "loss_multiplier": 0.0 if cut_chosen or cut_rejected else 1.0,
        "idx": idx,
    }


class _Template(NamedTuple):
    """How a conversation is templated (`get_formatted_message_log`'s options)."""

    add_bos: bool = False
    add_eos: bool = False
    add_generation_prompt: bool = False
    task_data_spec: TaskDataSpec | None = None
    tools: Sequence[Mapping[str, Any]] | None = None


def _templated(
    messages: Sequence[Mapping[str, str]],
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    first_trained: int | None,
    template: _Template,
) -> tuple[LLMMessageLogType, int, bool]:
    """Template (with BOS / EOS added where missing, see `build_sft_datum`), truncate to ``max_seq_length`` and add
    ``token_loss_mask``: messages from index ``first_trained`` on, or (None) every assistant message. Returns
    ``(message_log, length, truncated)``."""
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    message_log = get_formatted_message_log(
        messages,
        tokenizer,
        template.task_data_spec,
        add_bos_token=template.add_bos,
        add_eos_token=template.add_eos,
        add_generation_prompt=template.add_generation_prompt,
        tools=template.tools,
    )
    truncated = sum(len(m["token_ids"]) for m in message_log) > max_seq_length
    if truncated:
        _keep_prefix(message_log, max_seq_length, tokenizer)
    for i, message in enumerate(message_log):
        trained = message["role"] == "assistant" if first_trained is None else i >= first_trained
        message["token_loss_mask"] = torch.full_like(message["token_ids"], int(trained))
    return message_log, sum(len(m["token_ids"]) for m in message_log), truncated


def _keep_prefix(message_log: LLMMessageLogType, max_seq_length: int, tokenizer: PreTrainedTokenizerBase) -> None:
    """Keep the first ``max_seq_length`` tokens of the conversation (later messages become empty), in place, so a
    truncated sequence is still exactly ``max_seq_length`` tokens of the real templated text."""
    budget = max_seq_length
    for message in message_log:
        if len(message["token_ids"]) > budget:
            message["token_ids"] = message["token_ids"][:budget]
            message["content"] = tokenizer.decode(message["token_ids"].tolist(), skip_special_tokens=False)
        budget -= len(message["token_ids"])


class _RowDataset(torch.utils.data.Dataset):
    """Rows checked for ``required_fields`` and turned into datums lazily, on first access."""

    required_fields: tuple[str, ...] = ()

    def __init__(self, rows: Rows, tokenizer: PreTrainedTokenizerBase, max_seq_length: int, **options: Any):
        self.rows = rows
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.options = options  # datum-building options of the subclass (SFT: add_bos, add_eos)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        row = self.rows[idx]
        for key in self.required_fields:
            if not row.get(key):
                raise DataError(f"row {idx}: field {key!r} is missing or empty (row keys: {sorted(row)})")
        return self.build_datum(row, idx)

    def build_datum(self, row: Mapping[str, Any], idx: int) -> dict[str, Any]:
        raise NotImplementedError


class SFTDataset(_RowDataset):
    """SFT rows ``{"messages": [...]}`` → datums (:func:`build_sft_datum`)."""

    required_fields = ("messages",)

    def build_datum(self, row: Mapping[str, Any], idx: int) -> dict[str, Any]:
        return build_sft_datum(row["messages"], self.tokenizer, self.max_seq_length, idx, **self.options)


class PreferenceDataset(_RowDataset):
    """Preference rows ``{"context", "chosen", "rejected"}`` → datums (:func:`build_preference_datum`)."""

    required_fields = ("chosen", "rejected")

    def build_datum(self, row: Mapping[str, Any], idx: int) -> dict[str, Any]:
        return build_preference_datum(
            row.get("context") or [], row["chosen"], row["rejected"], self.tokenizer, self.max_seq_length, idx
        )


def build_datasets(
    dataset_cls: type[_RowDataset],
    loaded: LoadedDataset,
    tokenizer: PreTrainedTokenizerBase,
    cfg: SupervisedDataConfig,
    **options: Any,
) -> tuple[_RowDataset, _RowDataset | None]:
    """(train, validation or None) of ``loaded`` as ``dataset_cls`` (:class:`SFTDataset`, :class:`PreferenceDataset`)
    built with ``options``, without the rows longer than ``cfg.max_input_seq_length`` when ``cfg.drop_overlong``."""
    splits: list[_RowDataset | None] = []
    for split, rows in (("training", loaded.train), ("validation", loaded.validation)):
        dataset = None if rows is None else dataset_cls(rows, tokenizer, cfg.max_input_seq_length, **options)
        if dataset is not None and cfg.drop_overlong:
            dataset = _without_overlong(dataset, split)
        splits.append(dataset)
    if splits[0] is None:
        raise DataError(f"data.dataset_name={cfg.dataset_name!r} has no training rows")
    return splits[0], splits[1]


def _without_overlong(dataset: _RowDataset, split: str) -> _RowDataset:
    keep = [i for i in range(len(dataset)) if dataset[i]["loss_multiplier"] > 0]  # tokenizes every row once
    limit = f"data.max_input_seq_length={dataset.max_seq_length}"
    if not keep:
        raise DataError(f"data.drop_overlong: all {len(dataset)} {split} rows are longer than {limit}; raise it")
    rows = dataset.rows.select(keep) if isinstance(dataset.rows, datasets.Dataset) else [dataset.rows[i] for i in keep]
    print(f"data.drop_overlong: dropped {len(dataset) - len(keep)} of {len(dataset)} {split} rows longer than {limit}")
    return type(dataset)(rows, dataset.tokenizer, dataset.max_seq_length, **dataset.options)


def sft_collate_fn(
    batch: Sequence[Mapping[str, Any]], pad_token_id: int, make_sequence_length_divisible_by: int = 1
) -> BatchedDataDict:
    """B SFT datums → ``input_ids`` [B, S] long (right-padded with ``pad_token_id``), ``input_lengths`` [B] long,
    ``token_mask`` [B, S] float (1 = loss on that token), ``sample_mask`` [B] float (the loss multipliers) and
    ``idx`` (list of B)."""
    if not batch:
        raise ValueError("sft_collate_fn: got an empty batch")
    return _collate(
        [datum["message_log"] for datum in batch],
        [float(datum["loss_multiplier"]) for datum in batch],
        [datum["idx"] for datum in batch],
        pad_token_id,
        make_sequence_length_divisible_by,
    )


def preference_collate_fn(
    batch: Sequence[Mapping[str, Any]], pad_token_id: int, make_sequence_length_divisible_by: int = 1
) -> BatchedDataDict:
    """B preference datums → 2B rows interleaved (row 2i: chosen of pair i, row 2i+1: rejected), with the keys of
    :func:`sft_collate_fn`; both rows of a pair share ``sample_mask`` and ``idx``."""
    if not batch:
        raise ValueError("preference_collate_fn: got an empty batch")
    logs, multipliers, indices = [], [], []
    for datum in batch:
        logs += [datum["message_log_chosen"], datum["message_log_rejected"]]
        multipliers += [float(datum["loss_multiplier"])] * 2
        indices += [datum["idx"]] * 2
    return _collate(logs, multipliers, indices, pad_token_id, make_sequence_length_divisible_by)


def _collate(
    message_logs: list[LLMMessageLogType],
    loss_multipliers: list[float],
    indices: list[Any],
    pad_token_id: int,
    make_sequence_length_divisible_by: int,
) -> BatchedDataDict:
    flat, input_lengths = batched_message_log_to_flat_message(
        message_logs, {"token_ids": pad_token_id, "token_loss_mask": 0}, make_sequence_length_divisible_by
    )
    return BatchedDataDict(
        input_ids=flat["token_ids"],
        input_lengths=input_lengths,
        token_mask=flat["token_loss_mask"].to(torch.float32),
        sample_mask=torch.tensor(loss_multipliers, dtype=torch.float32),
        idx=indices,
    )

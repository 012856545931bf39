"""How `BatchedDataDict.shard_by_batch_size` splits a batch: its argument checks and the microbatch plan it attaches.

Pure bookkeeping on sizes, lengths and row indices; the batch itself gathers the rows (`batched_data_dict`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from nemo_rl_clone.distributed.sequence_packing import (
    PACKING_ALGORITHMS,
    ShardMicrobatches,
    plan_packed_groups,
    plan_token_bounded_shards,
)

_DYNAMIC_KEYS = {"input_key", "input_lengths_key", "max_tokens_per_microbatch", "sequence_length_round"}
_PACKING_KEYS = {"input_key", "input_lengths_key", "max_tokens_per_microbatch", "algorithm", "sequence_length_round"}
# NeMo-RL's name for the packing rounding (each sample's length is padded up to a multiple of it).
_PACKING_ROUND_ALIAS = "sequence_length_pad_multiple"

MicrobatchKind = Literal["dynamic", "packing"]


@dataclass(frozen=True)
class MicrobatchPlan:
    """Token-bounded microbatches of one shard, made by ``shard_by_batch_size``.

    Attributes:
        kind: ``"dynamic"`` (length-sorted, padded microbatches) or ``"packing"`` (bins to be packed into rows).
        input_key: the ``[B, S]`` token tensor the plan was made for; its sequence dim is truncated per microbatch.
        input_lengths_key: per-sample lengths used for the plan.
        indices: ``indices[g][m] = (start, end)``, the rows of microbatch ``m`` of global batch ``g`` in this shard.
        lengths: ``lengths[g][m]``; dynamic: the padded sequence length of the microbatch (its longest sample
            rounded up to ``sequence_length_round``); packing: the total (rounded) tokens in the bin. 0 when empty.
    """

    kind: MicrobatchKind
    input_key: str
    input_lengths_key: str
    indices: list[list[tuple[int, int]]]
    lengths: list[list[int]]


def split_sizes(total: int, parts: int) -> list[int]:
    """``parts`` near-equal sizes summing to ``total``; the first ``total % parts`` are one larger."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def as_int_list(values: torch.Tensor | list[Any]) -> list[int]:
    """Per-sample lengths as Python ints (a 1-D integer tensor or a list)."""
    if isinstance(values, torch.Tensor):
        if values.is_floating_point() or values.ndim != 1:
            raise ValueError(f"sequence lengths must be a 1-D integer tensor, got {values.dtype} {tuple(values.shape)}")
        return values.tolist()
    return [int(v) for v in values]


def checked_global_batch_size(size: int, shards: int, batch_size: int | None, allow_uneven_shards: bool) -> int:
    """``batch_size`` (default: the whole batch) after checking that it and ``shards`` split ``size`` evenly."""
    if shards < 1:
        raise ValueError(f"shard_by_batch_size: shards must be >= 1, got {shards}")
    if batch_size is None:
        batch_size = max(size, 1)  # an empty batch is zero global batches
    elif batch_size < 1:
        raise ValueError(f"shard_by_batch_size: batch_size must be >= 1, got {batch_size}")
    if size and size % batch_size:
        raise ValueError(
            f"shard_by_batch_size: batch of {size} samples is not a whole number of global batches of "
            f"batch_size={batch_size}"
        )
    if size and batch_size % shards and not allow_uneven_shards:
        raise ValueError(
            f"shard_by_batch_size: batch_size={batch_size} is not divisible by shards={shards}; "
            f"pass allow_uneven_shards=True to give the first shards one extra sample"
        )
    return batch_size


def contiguous_shard_rows(size: int, shards: int, batch_size: int, num_batches: int) -> list[list[int]]:
    """Rows of each shard in plain sharding: its contiguous piece of every global batch, in order."""
    piece_sizes = split_sizes(batch_size, shards) if size else [0] * shards
    offsets = [sum(piece_sizes[:s]) for s in range(shards)]
    return [
        [g * batch_size + offsets[s] + k for g in range(num_batches) for k in range(piece_sizes[s])]
        for s in range(shards)
    ]


def sample_lengths(batch: Mapping[str, Any], lengths_key: str, input_key: str) -> list[int]:
    """``batch[lengths_key]`` as ints, checked against the sequence width of the ``[B, S, ...]`` ``batch[input_key]``."""
    for key in (lengths_key, input_key):
        if key not in batch:
            raise KeyError(f"microbatching needs key {key!r}, batch has keys {list(batch)}")
    tokens = batch[input_key]
    if not isinstance(tokens, torch.Tensor) or tokens.ndim < 2:
        raise ValueError(f"input_key {input_key!r} must be a tensor [batch, seq, ...] for microbatching")
    lengths = as_int_list(batch[lengths_key])
    for index, length in enumerate(lengths):
        if not 0 <= length <= tokens.shape[1]:
            raise ValueError(
                f"{lengths_key}[{index}] = {length} is outside 0..{tokens.shape[1]} "
                f"(the sequence width of {input_key!r})"
            )
    return lengths


def plan_token_bounded(
    lengths: Sequence[int],
    shards: int,
    batch_size: int,
    kind: MicrobatchKind,
    args: Mapping[str, Any],
    rows_per_group: int = 1,
) -> list[ShardMicrobatches]:
    """Each shard's rows and microbatches for checked ``args`` (see `plan_token_bounded_shards`)."""
    budget, rounding = args["max_tokens_per_microbatch"], args["sequence_length_round"]
    if rows_per_group > 1:
        return plan_packed_groups(lengths, shards, batch_size, budget, rounding, args["algorithm"], rows_per_group)
    algorithm = args["algorithm"] if kind == "packing" else None
    return plan_token_bounded_shards(lengths, shards, batch_size, budget, rounding, algorithm)


def checked_microbatching_args(args: Mapping[str, Any], kind: MicrobatchKind) -> dict[str, Any]:
    """``dynamic_batching_args`` / ``sequence_packing_args`` checked, with ``sequence_length_round`` filled in."""
    name = "dynamic_batching_args" if kind == "dynamic" else "sequence_packing_args"
    if kind == "packing" and _PACKING_ROUND_ALIAS in args:
        args = dict(args)
        alias = args.pop(_PACKING_ROUND_ALIAS)
        if args.setdefault("sequence_length_round", alias) != alias:
            raise ValueError(
                f"{name}: sequence_length_round={args['sequence_length_round']!r} and its other name "
                f"{_PACKING_ROUND_ALIAS}={alias!r} disagree; give one"
            )
    allowed = _DYNAMIC_KEYS if kind == "dynamic" else _PACKING_KEYS
    unknown = sorted(set(args) - allowed)
    missing = sorted(allowed - {"sequence_length_round"} - set(args))
    if unknown or missing:
        raise ValueError(f"{name}: unknown keys {unknown}, missing keys {missing}; expected {sorted(allowed)}")
    checked = {"sequence_length_round": 1, **args}
    for key in ("max_tokens_per_microbatch", "sequence_length_round"):
        if not isinstance(checked[key], int) or checked[key] < 1:
            raise ValueError(f"{name}[{key!r}] must be a positive int, got {checked[key]!r}")
    if kind == "packing" and checked["algorithm"] not in PACKING_ALGORITHMS:
        raise ValueError(
            f"{name}['algorithm'] = {checked['algorithm']!r} is unknown; choose one of {list(PACKING_ALGORITHMS)}"
        )
    return checked

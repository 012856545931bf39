"""How `Policy` splits a batch over its data-parallel workers and puts their per-rank results back together."""

from __future__ import annotations

from typing import Any, Literal, cast

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.policy.config import PolicyConfig


def shard_batch(
    cfg: PolicyConfig, dp_size: int, data: BatchedDataDict, phase: Literal["train", "logprob"], **kwargs: Any
) -> tuple[list[BatchedDataDict], list[int] | None]:
    """``dp_size`` shards of ``data`` and, with dynamic batching or sequence packing (token-bounded microbatches of
    at most the section's ``<phase>_mb_tokens``), the order that undoes their length sorting. Also what a worker
    run in-process (the step replay) is handed."""
    dynamic, packing = cfg.dynamic_batching, cfg.sequence_packing
    if not dynamic.enabled and not packing.enabled:
        return cast(list[BatchedDataDict], data.shard_by_batch_size(dp_size, **kwargs)), None
    args: dict[str, Any] = {"input_key": "input_ids", "input_lengths_key": "input_lengths"}
    if dynamic.enabled:
        budget = dynamic.train_mb_tokens if phase == "train" else dynamic.logprob_mb_tokens or dynamic.train_mb_tokens
        args |= {"max_tokens_per_microbatch": budget, "sequence_length_round": dynamic.sequence_length_round}
        sharded = data.shard_by_batch_size(dp_size, dynamic_batching_args=args, **kwargs)
    else:
        budget = packing.train_mb_tokens if phase == "train" else packing.logprob_mb_tokens or packing.train_mb_tokens
        args |= {
            "max_tokens_per_microbatch": budget,
            "algorithm": packing.algorithm,
            "sequence_length_round": packing.sequence_length_round,
        }
        sharded = data.shard_by_batch_size(dp_size, sequence_packing_args=args, **kwargs)
    return cast(tuple[list[BatchedDataDict], list[int]], sharded)


def merge_shards(results: list[BatchedDataDict], order: list[int] | None) -> BatchedDataDict:
    """The per-rank results of a logprob-type call as one batch in ``data``'s row order (`shard_batch`'s order)."""
    merged = BatchedDataDict.from_batches(results)
    if order is not None:
        merged.reorder_data(order)
    return merged

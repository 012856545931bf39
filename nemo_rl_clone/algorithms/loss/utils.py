"""`prepare_loss_input` (NeMo-RL v0.7.0's ``nemo_rl.algorithms.loss.prepare_loss_input``): from a model's logits to
what a loss function reads.

A loss that reads the logits only as next-token logprobs (``accepts_token_logprobs``: clipped PG, NLL, preference
losses) gets them as `TokenLogprobs` — under its ``sampling_params`` (temperature, top-k, top-p), with the
temperature-only ones beside them when its KL term needs them (``needs_unfiltered_logprobs``); any other loss
(distillation's top-k KL) gets the logits. Either way the loss computes the same numbers as from the logits
themselves, which is what lets a worker compute the logprobs outside the loss (vocab-parallel, chunked).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_clone.algorithms.logits_sampling_utils import TrainingSamplingParams
from nemo_rl_clone.algorithms.loss.common import policy_logprobs
from nemo_rl_clone.algorithms.loss.interfaces import LossFunction, TokenLogprobs
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict


def prepare_loss_input(
    logits: torch.Tensor,
    data: BatchedDataDict[Any],
    loss_fn: LossFunction,
    vocab_parallel_rank: int | None = None,
    vocab_parallel_group: dist.ProcessGroup | None = None,
    context_parallel_group: dist.ProcessGroup | None = None,
    sampling_params: TrainingSamplingParams | None = None,
    chunk_size: int | None = None,
) -> tuple[dict[str, Any], BatchedDataDict[Any]]:
    """``(loss_input, data)``: call ``loss_fn(loss_input.pop("next_token_logits"), data, global_valid_seqs,
    global_valid_toks, **loss_input)``.

    Args:
        logits: ``[B, S, V]`` next-token logits (``[B, S, V / TP]`` with a vocab-parallel group: this rank's slice).
        data: the microbatch; ``input_ids`` ``[B, S]`` is read. Returned unchanged.
        loss_fn: the loss the input is for.
        vocab_parallel_rank, vocab_parallel_group: the vocabulary shard of ``logits`` (Megatron's TP group).
        context_parallel_group: passed on; the losses refuse more than one rank (they do not split sequences).
        sampling_params: the sampler's processing; default the loss's own ``sampling_params``.
        chunk_size: positions per logprob chunk (bounds the fp32 copy of the logits).

    Returns:
        ``{"next_token_logits": TokenLogprobs}`` (``values`` ``[B, S - 1]`` fp32) for a loss that accepts token
        logprobs, else ``{"next_token_logits": logits}`` plus the parallel arguments the loss reads them with.
    """
    if not getattr(loss_fn, "accepts_token_logprobs", False):
        parallel = {"vocab_parallel_rank": vocab_parallel_rank, "vocab_parallel_group": vocab_parallel_group}
        return {"next_token_logits": logits, **parallel, "logprob_chunk_size": chunk_size}, data
    sampling = sampling_params if sampling_params is not None else getattr(loss_fn, "sampling_params", None)

    def logprobs(processing: TrainingSamplingParams | None) -> torch.Tensor:  # what the loss would compute itself
        parallel = (vocab_parallel_rank, vocab_parallel_group, context_parallel_group, chunk_size)
        return policy_logprobs(logits, data, *parallel, processing)

    values = logprobs(sampling)
    unfiltered = None
    if sampling is not None and getattr(loss_fn, "needs_unfiltered_logprobs", False):
        unfiltered = logprobs(sampling.unfiltered())
    return {"next_token_logits": TokenLogprobs(values, unfiltered)}, data

"""`prepare_loss_input` (NeMo-RL v0.7.0's ``nemo_rl.algorithms.loss.prepare_loss_input``): from a model's logits to
what a loss function reads; and `policy_logprobs`, the one way a loss and a worker take the policy's logprobs.

A loss that reads the logits only as next-token logprobs (``accepts_token_logprobs``: clipped PG, NLL, preference
losses) gets them as `TokenLogprobs` — under its ``sampling_params`` (temperature, top-k, top-p), with the
temperature-only ones beside them when its KL term needs them (``needs_unfiltered_logprobs``); any other loss
(distillation's top-k KL) gets the logits. Either way the loss computes the same numbers as from the logits
themselves, which is what lets a worker compute the logprobs outside the loss (vocab-parallel, chunked).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_clone.contract.logprobs import token_logprobs_from_logits
from nemo_rl_clone.contract.loss import LossFunction, TokenLogprobs
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.errors import UserInputError


def policy_logprobs(
    logits: torch.Tensor | TokenLogprobs,
    data: Mapping[str, Any],
    vocab_parallel_rank: int | None,
    vocab_parallel_group: dist.ProcessGroup | None,
    context_parallel_group: dist.ProcessGroup | None,
    chunk_size: int | None,
    sampling: TrainingSamplingParams | None = None,
) -> torch.Tensor:
    """[B, S-1] fp32 logprobs of `data["input_ids"][:, 1:]` under `logits` (``chunk_size`` positions at a time),
    processed as ``sampling`` says, or those the policy already computed at the `token_mask` positions
    (`TokenLogprobs`: its ``values``, or its ``unfiltered`` ones when ``sampling`` filters nothing)."""
    if isinstance(logits, TokenLogprobs):
        if sampling is not None and not sampling.filters and logits.unfiltered is not None:
            return logits.unfiltered
        return logits.values
    if context_parallel_group is not None and dist.get_world_size(context_parallel_group) > 1:
        raise NotImplementedError("context parallelism is not supported by the losses; use context_parallel_size=1")
    vocab_start = None
    if vocab_parallel_group is not None and vocab_parallel_rank is not None:
        vocab_start = vocab_parallel_rank * logits.shape[-1]
    return token_logprobs_from_logits(
        logits, data["input_ids"], vocab_parallel_group, vocab_start, chunk_size, sampling=sampling
    )


def prepare_loss_input(
    logits: torch.Tensor,
    data: BatchedDataDict[Any],
    loss_fn: LossFunction,
    vocab_parallel_rank: int | None = None,
    vocab_parallel_group: dist.ProcessGroup | None = None,
    context_parallel_group: dist.ProcessGroup | None = None,
    sampling_params: TrainingSamplingParams | None = None,
    d2t: torch.Tensor | None = None,
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
        d2t: NeMo-RL's draft-to-target vocabulary map of an EAGLE draft model's loss; draft models are not built
            here, so anything but None is refused.
        chunk_size: positions per logprob chunk (bounds the fp32 copy of the logits).

    Returns:
        ``{"next_token_logits": TokenLogprobs}`` (``values`` ``[B, S - 1]`` fp32) for a loss that accepts token
        logprobs, else ``{"next_token_logits": logits}`` plus the parallel arguments the loss reads them with.
    """
    if d2t is not None:
        raise UserInputError("prepare_loss_input: d2t: not supported yet: training a speculative-decoding draft model")
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

"""Per-rank pieces of a training step and a logprob pass that do not depend on the worker's state.

Shapes: ``input_ids`` ``[B, S]`` right-padded token ids, ``input_lengths`` ``[B]`` valid lengths; logprobs are
``[B, S]`` fp32 where position ``i`` holds ``log p(token_i | tokens_<i)``, position 0 and padding are 0 (the layout
of every logprob tensor a policy returns and a loss reads, see `nemo_rl_clone.models.policy.interfaces`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from nemo_rl_clone.contract.logprobs import token_logprobs_from_logits
from nemo_rl_clone.contract.loss import LossType
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.model_utils import valid_counts


def microbatches(batch: BatchedDataDict, micro_batch_size: int) -> Iterator[BatchedDataDict]:
    """The microbatches of one rank's batch: its dynamic-batching or sequence-packing plan when it has one (a
    packing bin still comes as padded rows; the worker packs them), else fixed-size slices."""
    if batch.microbatch_plan is not None:
        if batch.microbatch_plan.kind == "packing":
            return batch.make_microbatch_iterator_for_packable_sequences()
        return batch.make_microbatch_iterator_with_dynamic_shapes()
    return batch.make_microbatch_iterator(micro_batch_size)


def count_microbatches(batch: BatchedDataDict, micro_batch_size: int) -> int:
    plan = batch.microbatch_plan
    if plan is not None:
        return sum(len(ranges) for ranges in plan.indices)
    return -(-batch.size // micro_batch_size)


def spec_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    input_lengths: torch.Tensor,
    chunk_size: int | None = None,
    vocab_parallel_rank: int | None = None,
    vocab_parallel_group: dist.ProcessGroup | None = None,
    sampling: TrainingSamplingParams | None = None,
) -> torch.Tensor:
    """``[B, S]`` fp32 logprobs of ``input_ids`` under next-token ``logits`` ``[B, S, V]`` (the layout above), or
    ``[B, S, V / tp]`` when the vocab is split over ``vocab_parallel_group`` (this rank's shard is number
    ``vocab_parallel_rank``).

    A 0 is prepended (token 0 has no prediction) and positions ``>= input_lengths`` are 0. ``chunk_size`` and
    ``sampling``: see `token_logprobs_from_logits`.
    """
    vocab_start = None if vocab_parallel_rank is None else vocab_parallel_rank * logits.shape[-1]
    next_token = token_logprobs_from_logits(
        logits,
        input_ids,
        vocab_parallel_group=vocab_parallel_group,
        vocab_start=vocab_start,
        chunk_size=chunk_size,
        sampling=sampling,
    )
    logprobs = F.pad(next_token, (1, 0))
    positions = torch.arange(input_ids.shape[1], device=logprobs.device)
    valid = positions.unsqueeze(0) < input_lengths.to(logprobs.device).unsqueeze(1)
    return torch.where(valid, logprobs, torch.zeros_like(logprobs))


def logprobs_within_lengths(
    batch: BatchedDataDict, token_logprobs: Callable[[BatchedDataDict, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """`spec_logprobs`' ``[B, S]`` layout from ``token_logprobs(batch, wanted)`` (``[B, S - 1]`` logprobs where
    ``wanted`` is set), asking only for the positions inside each row's ``input_lengths``."""
    input_ids = batch["input_ids"]
    positions = torch.arange(1, input_ids.shape[1], device=input_ids.device)
    wanted = positions.unsqueeze(0) < batch["input_lengths"].to(input_ids.device).unsqueeze(1)
    return F.pad(token_logprobs(batch, wanted), (1, 0))


def global_valid_counts(batch: Mapping[str, Any], group: dist.ProcessGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid sequences, valid tokens) of one global batch summed over the data-parallel ``group``.

    Losses without per-token masks (reward models) count sequences only; their token count is 0.
    """
    if "token_mask" in batch:
        return valid_counts(batch, group)
    if "sample_mask" not in batch:
        raise KeyError(
            f"policy.train: the batch needs a 'sample_mask' (and usually 'token_mask'); it has {list(batch)}"
        )
    counts = torch.stack([batch["sample_mask"].float().sum(), torch.tensor(0.0)])
    dist.all_reduce(counts, group=group)
    return counts[0], counts[1]


@dataclass(frozen=True)
class StepNormalization:
    """What one global batch's loss calls divide by, and the factor that brings their loss to the whole batch's.

    Without left-out rows (`trained_rows`) this is `global_valid_counts` and a factor of 1. With them, the loss
    divides by the counts of the rows it runs (so its metrics are means over those rows) and ``loss_scale`` = those
    counts / the whole batch's (of the count the loss type divides by) brings loss and gradient back to the whole
    batch's normalisation. ``trains`` is False when every row run is masked (``sample_mask`` 0): the loss then
    divides by the whole counts (those rows give exactly 0) and its other metrics describe nothing and are dropped.
    """

    valid_seqs: torch.Tensor
    valid_toks: torch.Tensor
    loss_scale: float = 1.0
    trains: bool = True
    whole: tuple[float, float] | None = None  # the whole global batch's counts, when rows were left out

    def reported_counts(self) -> dict[str, float]:
        """``global_valid_seqs`` / ``global_valid_toks`` as the workers report them: the whole global batch's."""
        seqs, toks = self.whole if self.whole is not None else (self.valid_seqs.item(), self.valid_toks.item())
        return {"global_valid_seqs": seqs, "global_valid_toks": toks}


def step_normalization(
    ran: tuple[torch.Tensor, torch.Tensor],
    whole: tuple[float, float] | None = None,
    loss_type: LossType | None = None,
) -> StepNormalization:
    """``ran``: `global_valid_counts` of the rows run; ``whole``: the whole global batch's (valid sequences, valid
    tokens) when `Policy.train` left rows out."""
    seqs, toks = ran
    if whole is None:
        return StepNormalization(seqs, toks)
    index = 0 if loss_type == LossType.SEQUENCE_LEVEL else 1
    count = float((seqs, toks)[index])
    if count == 0 or whole[index] == 0:
        return StepNormalization(torch.tensor(whole[0]), torch.tensor(whole[1]), trains=count != 0, whole=whole)
    return StepNormalization(seqs, toks, loss_scale=count / whole[index], whole=whole)


def global_batch_normalization(
    batch: Mapping[str, Any],
    group: dist.ProcessGroup,
    loss_normalization: list[tuple[float, float]] | None,
    index: int,
    loss_fn: Any,
) -> StepNormalization:
    """`step_normalization` of global batch ``index`` of a worker's ``train`` call (``loss_normalization``: what
    `Policy.train` passed, the whole global batches' counts when it left rows out)."""
    whole = loss_normalization[index] if loss_normalization is not None else None
    return step_normalization(global_valid_counts(batch, group), whole, getattr(loss_fn, "loss_type", None))


def scaled_loss(
    loss: torch.Tensor, metrics: dict[str, Any], norm: StepNormalization
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A loss call's result brought to the whole global batch's normalisation (see `StepNormalization`)."""
    if norm.loss_scale != 1.0:
        loss = loss * norm.loss_scale
        metrics = {**metrics, "loss": loss.item()}
    return loss, metrics if norm.trains else {"loss": loss.item()}


def pad_to_width(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad dim 1 with zeros to ``width`` (dynamic batching truncates microbatches to their longest sample)."""
    return F.pad(tensor, (0, width - tensor.shape[1])) if tensor.shape[1] < width else tensor


def require_keys(data: BatchedDataDict, keys: tuple[str, ...]) -> None:
    missing = [key for key in keys if key not in data]
    if missing:
        raise KeyError(f"policy batch is missing {missing}; it has {sorted(data)}")

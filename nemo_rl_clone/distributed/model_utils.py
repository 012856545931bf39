"""What a training worker needs to apply a loss: token logprobs from logits and valid-token counts.

This module knows no model and no algorithm. Workers import it to compute logprobs (also from a
vocab-parallel shard of the logits) and the global normalisation counts; the loss functions in
`nemo_rl_clone.algorithms.loss_functions` import it for the same logprobs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


class LossType(enum.Enum):
    """Which global count a loss divides by (`global_valid_toks` or `global_valid_seqs`)."""

    TOKEN_LEVEL = "token_level"
    SEQUENCE_LEVEL = "sequence_level"


class LossFunction(Protocol):
    """The call contract every loss handed to a policy worker follows.

    `loss_fn(next_token_logits, data, global_valid_seqs, global_valid_toks, ...) -> (loss, metrics)`,
    where `loss` is this microbatch's share of the global mean (see `valid_counts`) and every metric,
    summed over the microbatches of one global batch and over data-parallel ranks, gives its global value.
    """

    loss_type: LossType

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        /,  # positional: a reward-model loss reads scores, not next-token logits, and names them so
        vocab_parallel_rank: int | None = None,
        vocab_parallel_group: dist.ProcessGroup | None = None,
        context_parallel_group: dist.ProcessGroup | None = None,
    ) -> tuple[torch.Tensor, dict[str, float | int]]: ...


def valid_counts(data: Mapping[str, Any], group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(valid_seqs, valid_toks)` of a batch, summed over `group` when one is given.

    valid_seqs = Σ sample_mask; valid_toks = Σ token_mask[:, 1:] * sample_mask[:, None] (the tokens that
    are predicted, i.e. have a logprob). A trainer calls this on its whole local share of one global
    batch (all its microbatches) with the data-parallel group, and passes the results to every
    microbatch's loss call; the microbatch losses then sum to the global mean.
    """
    sample_mask = data["sample_mask"].float()
    token_mask = data["token_mask"][:, 1:].float()
    counts = torch.stack([sample_mask.sum(), (token_mask * sample_mask[:, None]).sum()])
    if group is not None:
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
    return counts[0], counts[1]


class _VocabParallelTokenLogprob(torch.autograd.Function):
    """log softmax(logits)[target] where the vocab dimension is split over the ranks of `group`.

    Every rank ends with the same [B, T] logprobs. The gradient is computed locally
    (d lp / d x_j = 1[j = target] − softmax_j): the loss built on these logprobs is replicated on the
    ranks, so an autograd-aware all_reduce (which sums the gradients again) would over-count them.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        vocab_start: int,
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        shard_size = logits.shape[-1]
        global_max = logits.max(dim=-1).values
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - global_max.unsqueeze(-1)
        exp_shifted = shifted.exp()
        sum_exp = exp_shifted.sum(dim=-1)
        dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)

        in_shard = (targets >= vocab_start) & (targets < vocab_start + shard_size)
        local_index = torch.where(in_shard, targets - vocab_start, 0).unsqueeze(-1)
        target_logit = shifted.gather(-1, local_index).squeeze(-1) * in_shard
        dist.all_reduce(target_logit, op=dist.ReduceOp.SUM, group=group)

        ctx.save_for_backward(exp_shifted.div_(sum_exp.unsqueeze(-1)), local_index, in_shard)
        return target_logit - sum_exp.log()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        softmax, local_index, in_shard = ctx.saved_tensors
        grad = softmax.mul(-grad_output.unsqueeze(-1))
        grad.scatter_add_(-1, local_index, (grad_output * in_shard).unsqueeze(-1))
        return grad, None, None, None


def token_logprobs_from_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    vocab_parallel_group: dist.ProcessGroup | None = None,
    vocab_start: int | None = None,
) -> torch.Tensor:
    """Logprob of each next token, in fp32: out[:, t] = log softmax(logits[:, t])[input_ids[:, t + 1]].

    Args:
        logits: [B, S, V] next-token logits (position t predicts token t+1), any float dtype; or the
            [B, S, V / tp] vocab shard of this rank when `vocab_parallel_group` is given; or a DTensor
            on a 1-D mesh, either replicated or sharded on the vocab dimension.
        input_ids: [B, S] token ids.
        vocab_parallel_group: the group the vocab dimension is split over (contiguous, equal shards).
        vocab_start: first vocab id of this rank's shard; default `group_rank * shard_size`.

    Returns:
        [B, S - 1] fp32 logprobs, aligned with `token_mask[:, 1:]`; differentiable w.r.t. `logits`.
        (SPEC §4's [B, S] convention is this tensor with a 0 prepended at position 0.)
    """
    if isinstance(logits, DTensor):
        logits, vocab_parallel_group, vocab_start = _unwrap_dtensor(logits)
    if logits.dim() != 3 or input_ids.dim() != 2 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits must be [B, S, V] and input_ids [B, S] with the same B and S; got logits "
            f"{tuple(logits.shape)} and input_ids {tuple(input_ids.shape)}"
        )
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:].to(device=logits.device, dtype=torch.long)
    if vocab_parallel_group is None:
        vocab_size = logits.shape[-1]
        if targets.numel() and (targets.min() < 0 or targets.max() >= vocab_size):
            raise ValueError(f"input_ids must lie in [0, {vocab_size}) (the logits' vocab size)")
        return logits.log_softmax(dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if vocab_start is None:
        vocab_start = dist.get_rank(vocab_parallel_group) * logits.shape[-1]
    return _VocabParallelTokenLogprob.apply(logits.contiguous(), targets, vocab_start, vocab_parallel_group)


def _unwrap_dtensor(logits: DTensor) -> tuple[torch.Tensor, dist.ProcessGroup | None, int | None]:
    """Local tensor, vocab group and vocab start of a DTensor of logits (1-D mesh only)."""
    mesh = logits.device_mesh
    if mesh.ndim != 1:
        raise ValueError(f"DTensor logits must live on a 1-D mesh, got mesh of shape {tuple(mesh.shape)}")
    placement = logits.placements[0]
    if placement.is_replicate():
        return logits.to_local(), None, None
    if isinstance(placement, Shard) and placement.dim in (-1, logits.dim() - 1):
        vocab_size = logits.shape[-1]
        if vocab_size % mesh.size() != 0:
            raise ValueError(f"vocab size {vocab_size} must divide evenly over {mesh.size()} ranks")
        start = mesh.get_local_rank() * (vocab_size // mesh.size())
        return logits.to_local(), mesh.get_group(), start
    raise ValueError(f"DTensor logits must be replicated or sharded on the vocab dim, got {placement}")

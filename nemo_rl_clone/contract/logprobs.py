"""Token logprobs from logits, as the trainer needs them: ``[B, S - 1]`` fp32, also from a vocab-parallel shard or a
DTensor, chunked over positions (the backward pass recomputes each chunk), and under the sampler's processing
(`nemo_rl_clone.contract.sampling`). Workers compute a loss's logprobs with it (`prepare_loss_input`); the losses
compute them with it when handed logits.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from nemo_rl_clone.contract.sampling import TrainingSamplingParams, processed_logits


def _logprob_parts(
    logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs, softmax, local target index, target-in-shard mask) of fp32 ``logits`` whose vocab dimension is
    split over ``group``; this rank holds ids ``[vocab_start, vocab_start + V_local)``."""
    shard_size = logits.shape[-1]
    global_max = logits.max(dim=-1).values
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - global_max.unsqueeze(-1)
    exp_shifted = shifted.exp()
    sum_exp = exp_shifted.sum(dim=-1)
    dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)

    in_shard = (targets >= vocab_start) & (targets < vocab_start + shard_size)
    local_index = torch.where(in_shard, targets - vocab_start, 0).unsqueeze(-1)
    # where, not a product: a shard may hold −inf logits (tokens the top-k/top-p filters dropped).
    target_logit = torch.where(in_shard, shifted.gather(-1, local_index).squeeze(-1), 0.0)
    dist.all_reduce(target_logit, op=dist.ReduceOp.SUM, group=group)
    return target_logit - sum_exp.log(), exp_shifted.div_(sum_exp.unsqueeze(-1)), local_index, in_shard


def _logprob_grad(
    softmax: torch.Tensor, local_index: torch.Tensor, in_shard: torch.Tensor, grad_output: torch.Tensor
) -> torch.Tensor:
    """d lp / d x_j = 1[j = target] − softmax_j, times ``grad_output`` (computed locally on each rank: the loss
    built on the logprobs is replicated, so summing the gradients over the ranks would over-count them)."""
    grad = softmax.mul_(-grad_output.unsqueeze(-1))
    return grad.scatter_add_(-1, local_index, (grad_output * in_shard).unsqueeze(-1))


class _VocabParallelTokenLogprob(torch.autograd.Function):
    """log softmax(logits)[target] where the vocab dimension is split over the ranks of `group`.

    Every rank ends with the same [B, T] logprobs; the softmax is kept for the backward pass.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        vocab_start: int,
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        logprobs, softmax, local_index, in_shard = _logprob_parts(logits, targets, vocab_start, group)
        ctx.save_for_backward(softmax, local_index, in_shard)
        return logprobs

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        softmax, local_index, in_shard = ctx.saved_tensors
        return _logprob_grad(softmax, local_index, in_shard, grad_output), None, None, None


class _ChunkedTokenLogprob(torch.autograd.Function):
    """Token logprobs computed ``chunk_size`` sequence positions at a time, in both passes.

    Only one chunk's fp32 softmax ``[B, chunk_size, V]`` exists at a time: the forward pass keeps the logits (in
    their own dtype) and the backward pass recomputes each chunk's softmax. ``group`` None: the whole vocabulary
    is local; otherwise it is split over ``group`` as in `_VocabParallelTokenLogprob`. ``sampling``: the logits are
    processed as the sampler did (`processed_logits`) in both passes.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        vocab_start: int,
        group: dist.ProcessGroup | None,
        chunk_size: int,
        sampling: TrainingSamplingParams | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(logits, targets)
        ctx.vocab_start, ctx.group, ctx.chunk_size, ctx.sampling = vocab_start, group, chunk_size, sampling
        chunks = []
        for start in range(0, logits.shape[1], chunk_size):
            chunk_targets = targets[:, start : start + chunk_size]
            chunk = processed_logits(logits[:, start : start + chunk_size], chunk_targets, sampling, group, vocab_start)
            if group is None:
                chunks.append(chunk.log_softmax(dim=-1).gather(-1, chunk_targets.unsqueeze(-1)).squeeze(-1))
            else:
                chunks.append(_logprob_parts(chunk, chunk_targets, vocab_start, group)[0])
        return torch.cat(chunks, dim=1) if chunks else logits.new_zeros(targets.shape, dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, targets = ctx.saved_tensors
        grad = torch.empty_like(logits)
        inverse_temperature = 1.0 / ctx.sampling.temperature if ctx.sampling is not None else 1.0
        for start in range(0, logits.shape[1], ctx.chunk_size):
            window = slice(start, start + ctx.chunk_size)
            chunk = processed_logits(logits[:, window], targets[:, window], ctx.sampling, ctx.group, ctx.vocab_start)
            if ctx.group is None:
                parts = (
                    chunk.softmax(dim=-1),
                    targets[:, window].unsqueeze(-1),
                    torch.ones_like(targets[:, window], dtype=torch.bool),
                )
            else:
                parts = _logprob_parts(chunk, targets[:, window], ctx.vocab_start, ctx.group)[1:]
            grad[:, window] = _logprob_grad(*parts, grad_output[:, window] * inverse_temperature)
        return grad, None, None, None, None, None


def token_logprobs_from_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    vocab_parallel_group: dist.ProcessGroup | None = None,
    vocab_start: int | None = None,
    chunk_size: int | None = None,
    sampling: TrainingSamplingParams | None = None,
) -> torch.Tensor:
    """Logprob of each next token, in fp32: out[:, t] = log softmax(logits[:, t])[input_ids[:, t + 1]]; with
    ``sampling``, under the distribution the generation engine sampled from (logits ÷ temperature, top-k/top-p
    filtered and renormalised: `nemo_rl_clone.contract.sampling`).

    Args:
        logits: [B, S, V] next-token logits (position t predicts token t+1), any float dtype; or the
            [B, S, V / tp] vocab shard of this rank when `vocab_parallel_group` is given; or a DTensor
            on a 1-D mesh, either replicated or sharded on the vocab dimension.
        input_ids: [B, S] token ids.
        vocab_parallel_group: the group the vocab dimension is split over (contiguous, equal shards).
        vocab_start: first vocab id of this rank's shard; default `group_rank * shard_size`.
        chunk_size: compute over this many sequence positions at a time (``policy.logprob_chunk_size``), so that
            the fp32 log-softmax of the whole ``[B, S, V]`` never exists (the backward pass recomputes it chunk by
            chunk); None: all positions at once.

    Returns:
        [B, S - 1] fp32 logprobs, aligned with `token_mask[:, 1:]`; differentiable w.r.t. `logits`.
        (The policy's [B, S] logprob layout is this tensor with a 0 prepended at position 0.)
    """
    if isinstance(logits, DTensor):
        logits, vocab_parallel_group, vocab_start = _unwrap_dtensor(logits)
    if logits.dim() != 3 or input_ids.dim() != 2 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits must be [B, S, V] and input_ids [B, S] with the same B and S; got logits "
            f"{tuple(logits.shape)} and input_ids {tuple(input_ids.shape)}"
        )
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    logits = logits[:, :-1]
    targets = input_ids[:, 1:].to(device=logits.device, dtype=torch.long)
    if vocab_parallel_group is None:
        vocab_size = logits.shape[-1]
        if targets.numel() and (targets.min() < 0 or targets.max() >= vocab_size):
            raise ValueError(f"input_ids must lie in [0, {vocab_size}) (the logits' vocab size)")
    elif vocab_start is None:
        vocab_start = dist.get_rank(vocab_parallel_group) * logits.shape[-1]
    if sampling is not None and sampling.is_identity:
        sampling = None
    if chunk_size is not None:
        return _ChunkedTokenLogprob.apply(logits, targets, vocab_start or 0, vocab_parallel_group, chunk_size, sampling)
    processed = processed_logits(logits, targets, sampling, vocab_parallel_group, vocab_start or 0)
    if vocab_parallel_group is None:
        return processed.log_softmax(dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return _VocabParallelTokenLogprob.apply(processed.contiguous(), targets, vocab_start, vocab_parallel_group)


def target_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    vocab_parallel_group: dist.ProcessGroup | None = None,
    vocab_start: int = 0,
) -> torch.Tensor:
    """``log softmax(logits)[targets]`` in fp32, differentiable: ``logits`` ``[B, T, V]`` (this rank's
    ``[B, T, V / tp]`` shard, starting at id ``vocab_start``, with a group) already aligned with ``targets`` ``[B, T]``."""
    logits = logits.float()
    if vocab_parallel_group is None:
        return logits.log_softmax(dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
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

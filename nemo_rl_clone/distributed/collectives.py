"""Collectives over ranks that hold different numbers of samples (NeMo-RL's ``nemo_rl.distributed.collectives``).

Both are collectives: every rank of ``group`` (default: the world) must call them. They run on any backend (the
tensor stays on its own device: NCCL wants it on the GPU, gloo on the CPU).
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def rebalance_nd_tensor(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0, in rank order; ranks may hold different dim-0 sizes but
    must agree on the other dimensions and the dtype (e.g. [3, D], [5, D], [2, D] → [10, D] on every rank)."""
    local_size = torch.tensor([tensor.size(0)], dtype=torch.int64, device=tensor.device)
    sizes = [torch.zeros_like(local_size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, local_size, group=group)
    counts = [int(size.item()) for size in sizes]
    # every rank writes its rows into its own slot of a zero tensor; the sum over ranks is the concatenation
    output = torch.zeros((sum(counts), *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    start = sum(counts[: dist.get_rank(group)])
    output[start : start + tensor.size(0)] = tensor
    dist.all_reduce(output, group=group)
    return output


def gather_jagged_object_lists(local_objects: list[T], group: dist.ProcessGroup | None = None) -> list[T]:
    """Every rank's list of picklable objects, concatenated in rank order (lists may differ in length):
    ranks holding [a, b], [c, d, e] and [f] all get [a, b, c, d, e, f]."""
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, local_objects, group=group)
    return [item for rank_objects in gathered for item in rank_objects]


class _GatherAlong(torch.autograd.Function):
    """Every rank's equally shaped ``local``, concatenated along ``dim`` in rank order. Every rank then computes
    from the same gathered tensor, so the backward sums the gradient over the group and keeps this rank's slice."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, local.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        rank, size = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        return grad.chunk(size, dim=ctx.dim)[rank], None, None


def gather_along(local: torch.Tensor, dim: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Differentiable all-gather of ``local`` along ``dim`` (a collective; gloo has no reduce-scatter, so the backward
    is an all-reduce and a slice). Used where every rank of ``group`` goes on with the same gathered tensor: context
    parallelism's sequence shards."""
    return _GatherAlong.apply(local, dim, group)

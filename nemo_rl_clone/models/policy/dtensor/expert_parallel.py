"""Expert parallelism for Hugging Face MoE models on the DTensor backend (``policy.dtensor_cfg.expert_parallel_size``).

Layout: the data-parallel ranks are also laid out as a 2-D mesh ``("edp", "ep")`` of shape (workers / EP, EP); the
EP ranks of one group are neighbours. Each MoE layer's expert tensors (the fused ``gate_up_proj`` / ``down_proj``
of transformers' experts modules, first dimension = experts) become DTensors sharded on the expert dimension over
``ep``: EP rank r holds experts [r × n / EP, (r + 1) × n / EP). FSDP2 then shards those local experts over ``edp``
(the ranks that hold the same experts), while every other parameter stays FSDP2 over all data-parallel ranks.
Checkpoints, optimizer state and the full state dict see ordinary DTensors, so DCP save/load and the refit export
(full, per-expert tensors) need nothing special.

Token dispatch is the simplest correct scheme: every EP rank all-gathers the tokens of its group (hidden states,
top-k ids and weights), runs its own experts on the tokens routed to them (the other slots get transformers' own
expert-parallel sentinel, ids >= the local expert count, which its experts kernels skip), and a reduce-scatter sums
the partial outputs back to the rank each token came from. The backward is the transpose (reduce-scatter of the
gathered tokens' gradients, all-gather of the outputs'). It moves EP × the tokens of an all-to-all, with no
capacity limit or token dropping; the routers, the load-balancing loss and router replay run before the dispatch,
on each rank's own tokens, so they are unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from nemo_rl_clone.utils.errors import UserInputError

KEY = "policy.dtensor_cfg.expert_parallel_size"


def refusal(num_experts: int, expert_parallel_size: int, data_parallel_size: int) -> str | None:
    """Why ``expert_parallel_size`` cannot split a model with ``num_experts`` routed experts (0: dense) over
    ``data_parallel_size`` ranks, or None."""
    ep = expert_parallel_size
    if ep == 1:
        return None
    if not num_experts:
        return f"{KEY}={ep} needs an MoE model (this one has no routed experts); set it to 1"
    if num_experts % ep:
        return f"{KEY}={ep} must divide the model's {num_experts} routed experts"
    if data_parallel_size % ep:
        return f"{KEY}={ep} must divide the data-parallel size {data_parallel_size} (the policy's workers)"
    return None


def build_mesh(device_type: str, expert_parallel_size: int) -> DeviceMesh:
    """The ``("edp", "ep")`` mesh over the whole world (every rank is data-parallel: MoE models refuse TP and CP)."""
    world_size = dist.get_world_size()
    shape = (world_size // expert_parallel_size, expert_parallel_size)
    return init_device_mesh(device_type, shape, mesh_dim_names=("edp", "ep"))


def experts_modules(model: nn.Module) -> list[nn.Module]:
    """transformers' fused experts modules (the classes its ``use_experts_implementation`` decorates: they carry
    ``_is_expert_parallel`` and a per-expert first dimension on every parameter)."""
    return [module for module in model.modules() if hasattr(module, "_is_expert_parallel")]


def shard_experts(model: nn.Module, mesh: DeviceMesh) -> list[nn.Module]:
    """Keep only this rank's block of experts in every experts module (as DTensors over ``ep``) and route each
    module's forward through `ExpertDispatch`; returns the modules (for FSDP over ``edp``)."""
    modules = experts_modules(model)
    if not modules:
        raise UserInputError(f"{KEY}: {type(model).__name__} has no transformers experts module to split; set it to 1")
    ep_mesh = mesh["ep"]
    for module in modules:
        for name, param in list(module.named_parameters(recurse=False)):
            if param.shape[0] != module.num_experts:
                raise UserInputError(f"{KEY}: {type(module).__name__}.{name} is not laid out one expert per row")
            # Every rank loaded the same weights: each keeps its block, no collective needed.
            sharded = distribute_tensor(param.detach(), ep_mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        module.forward = ExpertDispatch(module, ep_mesh)
    return modules


class ExpertDispatch:
    """An experts module's forward under expert parallelism: gather the group's tokens, run the local experts on
    the tokens routed to them, sum the partial outputs back to their ranks (see the module docstring)."""

    def __init__(self, module: Any, ep_mesh: DeviceMesh) -> None:
        self.module = module
        self.experts_forward = module.forward  # transformers' kernel choice (grouped_mm, eager, ...)
        self.group = ep_mesh.get_group()
        self.num_local = module.num_experts // ep_mesh.size()
        self.first = ep_mesh.get_local_rank() * self.num_local
        # transformers' own expert-parallel convention: the module counts its local experts and skips ids past them.
        module.num_experts = self.num_local
        module._is_expert_parallel = True

    def __call__(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> Any:
        counts = _row_counts(len(hidden_states), self.group)
        tokens = _GatherRows.apply(hidden_states, counts, self.group)
        weights = _GatherRows.apply(top_k_weights, counts, self.group)
        with torch.no_grad():
            ids = _gather_rows(top_k_index, counts, self.group) - self.first
            elsewhere = (ids < 0) | (ids >= self.num_local)
            ids = ids.masked_fill(elsewhere, self.num_local)
        weights = weights.masked_fill(elsewhere, 0.0)  # another rank adds these slots
        with _local_parameters(self.module):
            partial = self.experts_forward(tokens, ids, weights)
        return _ReduceScatterRows.apply(partial, counts, self.group)


@contextlib.contextmanager
def _local_parameters(module: nn.Module) -> Iterator[None]:
    """The experts kernels index plain tensors: show them this rank's block (``to_local`` keeps the autograd link
    to the DTensor parameter, which receives the gradient)."""
    registered: dict[str, Any] = module._parameters
    sharded = {name: p for name, p in registered.items() if isinstance(p, DTensor)}
    registered.update({name: p.to_local() for name, p in sharded.items()})
    try:
        yield
    finally:
        registered.update(sharded)


# ------------------------------------------------------------------ collectives over one EP group
def _row_counts(rows: int, group: dist.ProcessGroup) -> list[int]:
    """Each EP rank's number of tokens (they differ: ranks hold different microbatches)."""
    counts = torch.zeros(dist.get_world_size(group), dtype=torch.long)
    dist.all_gather_into_tensor(counts, torch.tensor([rows]), group=group)
    return counts.tolist()


def _padded(rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """``[sum(counts), ...]`` → ``[ranks × max(counts), ...]``: rank r's rows at block r, zeros after them."""
    width = max(counts)
    blocks = rows.split(counts)
    out = rows.new_zeros(len(counts) * width, *rows.shape[1:])
    for rank, block in enumerate(blocks):
        out[rank * width : rank * width + len(block)] = block
    return out


def _unpadded(rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
    width = max(counts)
    return torch.cat([rows[rank * width : rank * width + count] for rank, count in enumerate(counts)])


def _gather_rows(rows: torch.Tensor, counts: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's rows, in rank order: ``[sum(counts), ...]``."""
    width = max(counts)
    mine = rows.new_zeros(width, *rows.shape[1:])
    mine[: len(rows)] = rows
    out = rows.new_empty(len(counts) * width, *rows.shape[1:])
    dist.all_gather_into_tensor(out, mine.contiguous(), group=group)
    return _unpadded(out, counts)


def _reduce_scatter_rows(rows: torch.Tensor, counts: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """The sum over ranks of each rank's ``[sum(counts), ...]``, this rank's block of it."""
    padded = _padded(rows, counts)
    out = padded.new_empty(max(counts), *rows.shape[1:])
    dist.reduce_scatter_tensor(out, padded.contiguous(), group=group)
    return out[: counts[dist.get_rank(group)]]


class _GatherRows(torch.autograd.Function):
    """All-gather forward; its transpose (reduce-scatter of the gradient) backward."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, counts: list[int], group: dist.ProcessGroup) -> torch.Tensor:
        ctx.counts, ctx.group = counts, group
        return _gather_rows(rows, counts, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _reduce_scatter_rows(grad, ctx.counts, ctx.group), None, None


class _ReduceScatterRows(torch.autograd.Function):
    """Reduce-scatter forward; its transpose (all-gather of the gradient) backward."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, counts: list[int], group: dist.ProcessGroup) -> torch.Tensor:
        ctx.counts, ctx.group = counts, group
        return _reduce_scatter_rows(rows, counts, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _gather_rows(grad.contiguous(), ctx.counts, ctx.group), None, None

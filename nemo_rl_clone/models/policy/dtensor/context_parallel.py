"""Context parallelism (``policy.dtensor_cfg.context_parallel_size``): the ``cp`` ranks of one model replica each run
1/cp of every sequence, so activation memory per rank falls with the sequence length a rank holds.

Attention is torch's ring attention (``torch.distributed.tensor.experimental.context_parallel``): inside the context
every ``scaled_dot_product_attention`` call exchanges keys and values around the cp group, and the input buffers
(token ids, position ids, the head's selection) are split along the sequence with torch's head-and-tail load
balancing (rank r holds chunks r and 2cp-1-r of 2cp, so causal attention costs every rank the same). Everything
else in a decoder is per token. The model's output shards are then gathered (differentiably: the backward sums
each shard's gradient over the cp ranks) and put back in sequence order, so losses see the full ``[B, S, ...]``
layout they always see. Every cp rank computes the same loss, and its gradients are cp x its own tokens' share;
FSDP averages over the ``dp x cp`` ranks, so the usual scaling by the DP size still gives the global gradient.

Three things torch 2.13 does not do for us, all measured on CPU/gloo:
- The CPU SDPA kernel (``aten._scaled_dot_product_flash_attention_for_cpu``) has no context-parallel handler (torch
  registers the CUDA flash, efficient and cuDNN kernels only): `_install_cpu_ring_attention` routes it and its
  backward through torch's own ring-attention templates, as the CUDA kernels are.
- Its ring-attention handlers are switched off when its context exits, but the backward runs later (after the
  loss): `ContextParallel.run` switches them back on, and a context-parallel worker keeps them on.
- Hugging Face builds an explicit mask when position ids are not one run (rank 0 holds two chunks): ring attention
  needs ``is_causal=True`` without a mask, which the `ATTENTION` implementation registered here passes (right
  padding needs no mask: a causal mask already keeps valid positions from seeing the padding after them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental import context_parallel

from nemo_rl_clone.distributed.collectives import gather_along

ATTENTION = "cp_causal_sdpa"  # the attn_implementation the worker loads the model with when cp > 1
_SEQ_DIM = 2  # of SDPA's [batch, heads, sequence, head_dim] inputs


def _causal_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None


def register_attention() -> None:
    """Make `ATTENTION` a Hugging Face attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _causal_sdpa)
    AttentionMaskInterface.register(ATTENTION, _no_mask)


def _install_cpu_ring_attention() -> None:
    """Teach torch's context parallelism the CPU SDPA kernel (see the module docstring); idempotent."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    aten = torch.ops.aten
    forward_op = aten._scaled_dot_product_flash_attention_for_cpu.default
    backward_op = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def local(tensor: Any) -> Any:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    def forward(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[DTensor, ...]:
        query, key, value = args[:3]
        if kwargs.get("attn_mask") is not None:
            raise NotImplementedError("context parallelism needs causal attention without an explicit mask")
        mesh = query.device_mesh
        out, logsumexp = cp_attention._templated_ring_attention(
            mesh.get_group(),
            _SEQ_DIM,
            forward_op,
            local(query),
            local(key),
            local(value),
            is_causal=args[4] if len(args) > 4 else kwargs.get("is_causal", False),
            dropout_p=args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0),
            scale=kwargs.get("scale"),
        )
        return tuple(DTensor.from_local(t, mesh, [Shard(_SEQ_DIM)], run_check=False) for t in (out, logsumexp))

    def backward(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[DTensor, ...]:
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal = args[:8]
        mesh = query.device_mesh
        grads = cp_attention._templated_ring_attention_backward(
            mesh.get_group(),
            _SEQ_DIM,
            backward_op,
            grad_out=local(grad_out),
            grad_out_name="grad_out",
            query=local(query),
            key=local(key),
            value=local(value),
            out=local(out),
            logsumexp=local(logsumexp),
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=kwargs.get("scale"),
        )
        return tuple(DTensor.from_local(t, mesh, [Shard(_SEQ_DIM)], run_check=False) for t in grads)

    cp_attention.custom_ops.setdefault(forward_op, forward)
    cp_attention.custom_ops.setdefault(backward_op, backward)


class ContextParallel:
    """Runs a model over sequences split across the ranks of ``mesh`` (the cp sub-mesh of a replica)."""

    def __init__(self, mesh: DeviceMesh) -> None:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

        self._cp_attention = cp_attention
        self.mesh = mesh
        self.size = mesh.size()
        register_attention()
        if mesh.device_type == "cpu":
            _install_cpu_ring_attention()

    def run(self, forward: Callable[..., torch.Tensor], tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """``forward(*local_tensors, position_ids=local_positions)`` on this rank's part of ``tensors`` (each
        ``[B, S]``, right-padded, split along the sequence), its output ``[B, S_local, ...]`` gathered back to
        ``[B, S, ...]`` in sequence order."""
        batch, width = tensors[0].shape[:2]
        multiple = 2 * self.size  # head-and-tail balancing splits the sequence into 2 x cp equal chunks
        padded = -(-width // multiple) * multiple
        buffers = [F.pad(t, (0, padded - width)).contiguous() for t in tensors]
        positions = torch.arange(padded, device=buffers[0].device).expand(batch, padded).contiguous()
        buffers.append(positions)
        with context_parallel(
            self.mesh, buffers=buffers, buffer_seq_dims=[1] * len(buffers), no_restore_buffers=set(buffers)
        ):
            output = forward(*buffers[:-1], position_ids=positions)
            local_positions = positions[0].clone()  # which positions this rank held: the sharding's own record
        # Leaving the context switches torch's ring-attention handlers off, but the backward of ``output`` (run later,
        # after the loss) dispatches through them: a context-parallel worker keeps them on.
        self._cp_attention._enable_cp_dtensor_dispatcher()
        return self._gather(output, local_positions)[:, :width]

    def _gather(self, local: torch.Tensor, local_positions: torch.Tensor) -> torch.Tensor:
        group = self.mesh.get_group()
        gathered = gather_along(local, 1, group)
        held = [torch.empty_like(local_positions) for _ in range(self.size)]
        dist.all_gather(held, local_positions, group=group)
        return gathered.index_select(1, torch.cat(held).argsort())

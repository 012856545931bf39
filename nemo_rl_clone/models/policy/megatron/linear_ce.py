"""NeMo-RL's ``megatron_cfg.use_linear_ce_fusion_loss``: a training step that never builds the ``[B, S, V / tp]``
logits. While it runs, the output layer hands on its input (the final norm's hidden states, gathered over the
tensor-parallel ranks as the layer itself would gather them) and the loss's token logprobs are computed from them
``linear_ce_fusion_chunk_size`` positions at a time; each chunk's logits are recomputed in the backward pass, so at
most one chunk's ``[B, chunk, V / tp]`` exists. The numbers are the unfused path's: the same matmul, the same fp32
log-softmax per position. As in NeMo-RL it applies to training (logprob passes keep the plain head), to losses that
read token logprobs (SFT's NLL, DPO) and not to context parallelism (validation refuses the rest)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)
from torch.utils.checkpoint import checkpoint

from nemo_rl_clone.contract.logprobs import target_logprobs

DEFAULT_CHUNK_SIZE = 256  # NeMo-RL's default for linear_ce_fusion_chunk_size


class HiddenStatesHead:
    """Makes Megatron's ``output_layer`` (a ``ColumnParallelLinear``) return its input instead of logits while
    `active`; `weight` is then the matrix it would have multiplied by (the embedding's, under tied weights)."""

    def __init__(self, output_layer: torch.nn.Module) -> None:
        self.layer = output_layer
        self.weight: torch.Tensor | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        self.layer.forward = self._forward  # an instance attribute shadows the class's forward
        try:
            yield
        finally:
            del self.layer.forward

    def _forward(
        self, input_: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output: Any = None
    ) -> tuple[torch.Tensor, None]:
        self.weight = cast(torch.Tensor, self.layer.weight) if weight is None else weight
        # The layer's own input handling: the whole sequence on every rank, and in the backward pass the sum of the
        # ranks' partial gradients (each rank's vocabulary rows contribute one part).
        if self.layer.sequence_parallel:
            hidden = gather_from_sequence_parallel_region(
                input_, tensor_parallel_output_grad=True, group=self.layer.tp_group
            )
        else:
            hidden = copy_to_tensor_model_parallel_region(input_, group=self.layer.tp_group)
        return hidden, None


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    chunk_size: int,
    vocab_parallel_group: dist.ProcessGroup | None = None,
    vocab_start: int = 0,
) -> torch.Tensor:
    """``[B, S - 1]`` fp32 logprobs of ``input_ids[:, 1:]`` from ``hidden`` ``[B, S, H]`` and this rank's vocabulary
    rows ``weight`` ``[V / tp, H]`` (from id ``vocab_start``), ``chunk_size`` positions at a time."""
    targets = input_ids[:, 1:].to(device=hidden.device, dtype=torch.long)
    chunks = []
    for start in range(0, targets.shape[1], chunk_size):
        stop = min(start + chunk_size, targets.shape[1])
        chunks.append(
            checkpoint(
                _chunk_logprobs,
                hidden[:, start:stop],
                weight,
                targets[:, start:stop],
                vocab_parallel_group,
                vocab_start,
                use_reentrant=False,
            )
        )
    return torch.cat(chunks, dim=1) if chunks else hidden.new_zeros(targets.shape, dtype=torch.float32)


def _chunk_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_parallel_group: dist.ProcessGroup | None,
    vocab_start: int,
) -> torch.Tensor:
    logits = F.linear(hidden.to(weight.dtype), weight)  # the output layer's matmul, in its compute dtype
    return target_logprobs(logits, targets, vocab_parallel_group, vocab_start)

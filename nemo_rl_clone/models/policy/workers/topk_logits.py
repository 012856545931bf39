"""Per-position top-k of a causal LM's logits: what a distillation teacher hands the student's loss
(`Policy.get_topk_logits`, `DistillationLossFn`).

Layout: ``topk_logits`` ``[B, S, k]`` (the model's compute dtype cast to fp32) and ``topk_indices`` ``[B, S, k]``
(int64 vocab ids), position t holding the top-k of the logits at position t, i.e. of the prediction of token t+1
(NeMo-RL's layout: no shift, the last position included; the loss drops it). Values are sorted, largest first.
Positions at or beyond a row's ``input_lengths`` hold 0 in both (they are never scored), so results do not depend on
how the batch was padded or packed.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def check_k(k: int, vocab_size: int | None = None) -> None:
    """Raise ValueError unless 1 <= k (<= vocab_size when known)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"get_topk_logits: k must be an int >= 1, got {k!r}")
    if vocab_size is not None and k > vocab_size:
        raise ValueError(f"get_topk_logits: k={k} exceeds the model's vocabulary size {vocab_size}")


def topk_of_logits(
    logits: torch.Tensor, k: int, input_lengths: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values fp32, indices int64), each ``[B, width, k]`` on CPU, of ``logits`` ``[B, S, V]`` (S <= width: a
    microbatch cut at its longest row is right-padded to the batch's width)."""
    if isinstance(logits, DTensor):  # a vocab-sharded head: the top-k needs every shard
        logits = logits.full_tensor()
    check_k(k, logits.shape[-1])
    values, indices = logits.float().topk(k, dim=-1)
    positions = torch.arange(logits.shape[1], device=logits.device)
    valid = (positions.unsqueeze(0) < input_lengths.to(logits.device).unsqueeze(1)).unsqueeze(-1)
    values = torch.where(valid, values, torch.zeros_like(values))
    indices = torch.where(valid, indices, torch.zeros_like(indices))
    pad = width - logits.shape[1]
    if pad > 0:
        values = torch.nn.functional.pad(values, (0, 0, 0, pad))
        indices = torch.nn.functional.pad(indices, (0, 0, 0, pad))
    return values.cpu(), indices.cpu()

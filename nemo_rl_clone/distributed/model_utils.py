"""The valid-token counts a training worker divides a loss by, summed over the data-parallel group.

This module knows no model and no algorithm. The loss protocol (`LossFunction`, `LossType`, `TokenLogprobs`) is in
`nemo_rl_clone.contract.loss`, token logprobs from logits in `nemo_rl_clone.contract.logprobs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist


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

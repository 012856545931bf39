"""What every loss here shares: the required-keys check, the policy's logprobs of the sampled tokens, and the
shifted masks and tensors of the call contract described in `loss_functions`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_clone.algorithms.logits_sampling_utils import TrainingSamplingParams
from nemo_rl_clone.algorithms.loss.interfaces import TokenLogprobs
from nemo_rl_clone.distributed.model_utils import token_logprobs_from_logits

Metrics = dict[str, float | int]


def require_keys(data: Mapping[str, Any], keys: tuple[str, ...], owner: str) -> None:
    missing = [key for key in keys if key not in data]
    if missing:
        raise KeyError(f"{owner}: data is missing {missing} (it needs {list(keys)})")


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


def shifted(data: Mapping[str, Any], key: str, like: torch.Tensor) -> torch.Tensor:
    """data[key][:, 1:] in fp32 on `like`'s device ([B, S] policy-layout tensors → [B, S-1])."""
    return data[key][:, 1:].to(device=like.device, dtype=torch.float32)


def masks(data: Mapping[str, Any], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token_mask[:, 1:], sample_mask, m = token_mask[:, 1:] * sample_mask[:, None]) in fp32."""
    token_mask = shifted(data, "token_mask", like)
    sample_mask = data["sample_mask"].to(device=like.device, dtype=torch.float32)
    return token_mask, sample_mask, token_mask * sample_mask.unsqueeze(-1)


def masked_diff(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """a − b where valid, else 0: padding holding −inf or NaN never reaches an exp or a gradient."""
    return torch.where(valid, a - b, torch.zeros_like(a))

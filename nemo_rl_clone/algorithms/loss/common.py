"""What every loss here shares: the required-keys check and the shifted masks and tensors of the call contract
described in `loss_functions` (the policy's logprobs of the sampled tokens are `contract.loss_input.policy_logprobs`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

Metrics = dict[str, float | int]


def require_keys(data: Mapping[str, Any], keys: tuple[str, ...], owner: str) -> None:
    missing = [key for key in keys if key not in data]
    if missing:
        raise KeyError(f"{owner}: data is missing {missing} (it needs {list(keys)})")


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

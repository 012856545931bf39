"""Small tensor helpers shared by the RL algorithms: masked reductions and KL estimators."""

from __future__ import annotations

import torch


def masked_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    dim: int | None = None,
    global_normalization_factor: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is non-zero.

    Args:
        values: any shape.
        mask: broadcastable to `values`; 1 (or a weight) where a value counts, 0 where it does not.
            Values at masked-out positions are ignored even when they are NaN or inf, and get a zero
            gradient.
        dim: reduce only this dimension (result has it removed); None reduces everything to a 0-dim
            tensor.
        global_normalization_factor: divide Σ values·mask by this instead of Σ mask, e.g. the number of
            valid tokens across all microbatches and data-parallel ranks, so that one microbatch's result
            is its share of the global mean.

    Returns:
        Σ values·mask / normaliser, and 0 (not NaN) where the normaliser is 0 (empty mask).
    """
    values, mask = torch.broadcast_tensors(values, mask.to(values.dtype))
    kept = torch.where(mask != 0, values * mask, torch.zeros_like(values))
    total = kept.sum() if dim is None else kept.sum(dim=dim)
    if global_normalization_factor is None:
        denominator = mask.sum() if dim is None else mask.sum(dim=dim)
    else:
        denominator = torch.as_tensor(global_normalization_factor, dtype=total.dtype, device=total.device)
    safe_denominator = torch.where(denominator != 0, denominator, torch.ones_like(denominator))
    return torch.where(denominator != 0, total / safe_denominator, torch.zeros_like(total))


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, clamp: float | None = 20.0) -> torch.Tensor:
    """Per-token k3 estimator of KL(π ‖ π_ref) on tokens sampled from π (Schulman, 2020).

    k3 = e^d − d − 1 with d = clamp(ref_logprobs − logprobs, −clamp, clamp). It is ≥ 0 everywhere, 0 where
    the two logprobs agree, and unbiased for KL(π ‖ π_ref) when the tokens come from π. The clamp bounds
    e^d (and its gradient, which is 0 outside the clamp) for tokens where the two policies disagree wildly.

    Args:
        logprobs, ref_logprobs: same shape, log π(token) and log π_ref(token).
        clamp: bound on |d|; None disables it.
    """
    log_ratio = ref_logprobs - logprobs
    if clamp is not None:
        log_ratio = log_ratio.clamp(min=-clamp, max=clamp)
    return log_ratio.exp() - log_ratio - 1

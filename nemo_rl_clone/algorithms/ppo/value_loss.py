"""The critic's loss for PPO: NeMo-RL's ``MseValueLossFn`` (``value_loss_fn`` section).

Per response token, with V the critic's current prediction, V_old its prediction at rollout time (the batch key
``values``) and R the GAE return (``returns``):

    clip(V) = clamp(V, V_old − c, V_old + c)
    ℓ = max((V − R)², (clip(V) − R)²)          c = ``cliprange``; with c null or 0: ℓ = (V − R)²
    L = scale · ½ · Σ ℓ·m / global_valid_toks   m = token_mask · sample_mask

As in NeMo-RL (``nemo_rl/algorithms/loss/loss_functions.py``): the ½, ``scale`` multiplying the whole loss, the
clip around the *old value* (PPO2's value clip, not around R), and no clipping when ``cliprange`` is null or 0.
Where the clipped term wins and V is beyond the clip, the token's gradient is 0: the critic cannot move further
from V_old than c in one rollout batch by that token.

Tensors are aligned (no shift): ``values`` ``[B, T]`` (or ``[B, T, 1]`` straight from a value head), and every
``[B, T]`` batch key, are indexed by the same token positions.

Metrics follow the loss protocol of `nemo_rl_clone.algorithms.loss.loss_functions`: each is this microbatch's
share of a global mean (Σ over the microbatch / ``global_valid_toks``), so the trainer sums them over microbatches
and data-parallel ranks. ``loss``; ``vf_clipfrac`` (share of tokens whose clipped term is strictly larger);
``values_mean``, ``returns_mean``; ``returns_sq_mean`` (E[R²]) and ``residual_sq_mean`` (E[(R − V)²]), from which
`explained_variance` computes 1 − Var(R − V)/Var(R) once they are summed (a ratio cannot be summed itself);
``num_valid_samples`` (local Σ sample_mask).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_clone.algorithms.ppo.config import MseValueLossConfig
from nemo_rl_clone.algorithms.utils import masked_mean
from nemo_rl_clone.contract.loss import LossType
from nemo_rl_clone.utils.config_validation import ConfigError, as_config

Metrics = dict[str, float | int]


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    scale: float = 1.0,
    cliprange: float | None = None,
    global_valid_toks: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """(L, metrics) of the module doc for ``[B, T]`` tensors; ``global_valid_toks`` None divides by Σ mask (a call
    that sees the whole batch). ``old_values`` and ``returns`` are targets: no gradient flows into them."""
    if not values.shape == old_values.shape == returns.shape == mask.shape:
        shapes = [tuple(t.shape) for t in (values, old_values, returns, mask)]
        raise ValueError(f"values, old_values, returns and mask must have one shape, got {shapes}")
    valid = mask != 0
    weights = mask.to(torch.float32)
    predicted = values.float()
    # Padding may hold NaN or inf; torch.where keeps it out of the squares and their gradients.
    target = torch.where(valid, returns.detach().float(), 0.0)
    old = torch.where(valid, old_values.detach().float(), 0.0)
    predicted = torch.where(valid, predicted, 0.0)

    def token_mean(per_token: torch.Tensor) -> torch.Tensor:
        return masked_mean(per_token, weights, global_normalization_factor=global_valid_toks)

    unclipped = (predicted - target).square()
    if cliprange:  # null or 0: no clip (NeMo-RL)
        clipped_values = torch.clamp(predicted, old - cliprange, old + cliprange)
        clipped = (clipped_values - target).square()
        per_token = torch.maximum(unclipped, clipped)
        clip_fraction = token_mean((clipped > unclipped).float()).item()
    else:
        per_token = unclipped
        clip_fraction = 0.0
    loss = 0.5 * scale * token_mean(per_token)

    with torch.no_grad():
        metrics: Metrics = {
            "loss": loss.item(),
            "vf_clipfrac": clip_fraction,
            "values_mean": token_mean(predicted).item(),
            "returns_mean": token_mean(target).item(),
            "returns_sq_mean": token_mean(target.square()).item(),
            "residual_sq_mean": token_mean(unclipped).item(),
        }
    return loss, metrics


def explained_variance(metrics: Mapping[str, float | int]) -> float:
    """1 − Var(R − V)/Var(R) over the response tokens, from `clipped_value_loss`'s metrics summed over the
    microbatches of a batch (or from one call on the whole batch). NaN when the returns do not vary (undefined).

    1 means the critic predicts the returns exactly, 0 that it does no better than their mean. The variances are
    the population ones; the n/(n − 1) of the unbiased ones would cancel in the ratio."""
    returns_mean = float(metrics["returns_mean"])
    residual_mean = returns_mean - float(metrics["values_mean"])
    returns_var = float(metrics["returns_sq_mean"]) - returns_mean**2
    residual_var = float(metrics["residual_sq_mean"]) - residual_mean**2
    if returns_var <= 1e-12 * max(1.0, float(metrics["returns_sq_mean"])):
        return math.nan
    return 1.0 - residual_var / returns_var


class MseValueLossFn:
    """`clipped_value_loss` behind the loss protocol (NeMo-RL's class name). Data keys: ``returns``, ``values`` (the
    critic's predictions at rollout time), ``token_mask``, ``sample_mask``; all ``[B, T]`` but ``sample_mask``
    ``[B]``. ``next_token_logits`` is the value head's output, ``[B, T]`` or ``[B, T, 1]``."""

    loss_type = LossType.TOKEN_LEVEL

    def __init__(self, cfg: Mapping[str, Any] | MseValueLossConfig | None = None) -> None:
        try:
            self.cfg = as_config(MseValueLossConfig() if cfg is None else cfg, MseValueLossConfig, "value_loss_fn")
        except ConfigError as error:
            raise ValueError("invalid MseValueLossFn config:\n  " + "\n  ".join(error.problems)) from None
        # as_config takes a dataclass as is; its values are still checked here.
        problems = [f"value_loss_fn.{key}: {message}" for key, message in self.cfg.check()]
        if problems:
            raise ValueError("invalid MseValueLossFn config:\n  " + "\n  ".join(problems))

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        vocab_parallel_rank: int | None = None,
        vocab_parallel_group: dist.ProcessGroup | None = None,
        context_parallel_group: dist.ProcessGroup | None = None,
        logprob_chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        missing = [key for key in ("returns", "values", "token_mask", "sample_mask") if key not in data]
        if missing:
            raise KeyError(f"MseValueLossFn: data is missing {missing}")
        values = next_token_logits
        if values.dim() == 3 and values.shape[-1] == 1:
            values = values.squeeze(-1)
        device = values.device
        sample_mask = data["sample_mask"].to(device=device, dtype=torch.float32)
        mask = data["token_mask"].to(device=device, dtype=torch.float32) * sample_mask.unsqueeze(-1)
        loss, metrics = clipped_value_loss(
            values,
            data["values"].to(device),
            data["returns"].to(device),
            mask,
            scale=self.cfg.scale,
            cliprange=self.cfg.cliprange,
            global_valid_toks=global_valid_toks,
        )
        metrics["num_valid_samples"] = sample_mask.sum().item()
        return loss, metrics

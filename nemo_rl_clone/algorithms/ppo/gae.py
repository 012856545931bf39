"""Token-level Generalized Advantage Estimation (arXiv 1506.02438) for PPO with a critic.

Shapes: B samples, T token positions. ``mask`` ``[B, T]`` is non-zero at the response tokens, the actions the
policy is trained on; everything else (prompt, padding, environment turns) is ignored, whatever it holds.
``values[b, t]`` is the critic's V(s_t), the value of the state in which token t is generated.

Over the response tokens t_0 < t_1 < … < t_{n-1} of a row (k indexes them):

    δ_k = r_k + γ·V_{k+1} − V_k          with V_n = 0: the episode ends after the last response token
    A_k = Σ_{j ≥ k} (γλ)^{j-k} δ_j = δ_k + γλ·A_{k+1}
    R_k = A_k + V_k                      (the critic's target, "returns")

Non-response positions between response tokens (the environment's turns in a multi-turn rollout) are skipped: the
last token of a turn bootstraps from the first token of the next. This is NeMo-RL's "carry-forward" masking; for
a contiguous response it is the textbook recursion. Outside the mask advantages and returns are 0 (NeMo-RL leaves
its returns unmasked there; no loss reads them).

A per-sequence reward ``[B]`` is placed on the row's last response token (NeMo-RL's placement); per-token rewards
``[B, T]`` are used as given at the response tokens.

``normalize_advantages`` whitens the advantages over every response token of the batch: (A − mean)/sqrt(var +
1e-8) with the *unbiased* variance (Bessel's n − 1). That is NeMo-RL's ``masked_var`` default, kept so that runs
match; over the thousands of tokens of a PPO batch the two variances differ by far less than the 1e-8.

VAPO (arXiv 2504.05118): returns use λ_value, advantages λ_policy (two passes when they differ); with
``length_adaptive_alpha`` α > 0 each sample gets λ_policy = 1 − 1/max(α·l, 1), l its response length.
"""

from __future__ import annotations

import torch

from nemo_rl_clone.algorithms.ppo.config import GAEConfig

WHITEN_EPSILON = 1e-8  # added to the variance before the rsqrt (NeMo-RL's)


def _response_mask(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    if values.dim() != 2 or mask.shape != values.shape:
        raise ValueError(f"values and mask must both be [B, T], got {tuple(values.shape)} and {tuple(mask.shape)}")
    return mask != 0


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: each sample's scalar reward (``rewards`` ``[B]``) on its last response token, 0 elsewhere; a row
    without response tokens gets nothing."""
    valid = mask != 0
    if rewards.dim() != 1 or rewards.shape[0] != valid.shape[0]:
        raise ValueError(f"rewards must be [B] with B = {valid.shape[0]}, got {tuple(rewards.shape)}")
    positions = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, -1).amax(dim=1)
    placed = torch.zeros(valid.shape, dtype=rewards.dtype, device=rewards.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    placed[rows, last[rows]] = rewards[rows]
    return placed


def _per_row_lambda(lam: float | torch.Tensor, rows: int, like: torch.Tensor) -> torch.Tensor:
    lam_t = torch.as_tensor(lam, dtype=like.dtype, device=like.device)
    if lam_t.dim() == 0:
        lam_t = lam_t.expand(rows)
    if lam_t.shape != (rows,):
        raise ValueError(f"lam must be a number or [B] with B = {rows}, got shape {tuple(lam_t.shape)}")
    if bool(((lam_t < 0) | (lam_t > 1)).any()):
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    return lam_t


def generalized_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both ``[B, T]`` and 0 outside ``mask``, by the recursion in the module doc.

    Args:
        rewards: ``[B]`` one reward per sample (put on its last response token) or ``[B, T]`` per-token rewards.
        values: ``[B, T]`` the critic's V(s_t) at rollout time (not differentiated through).
        mask: ``[B, T]`` non-zero at response tokens.
        gamma: discount ``gae_gamma`` in [0, 1].
        lam: ``gae_lambda`` in [0, 1], or ``[B]`` one λ per sample.

    Computed in at least float32 (float64 stays float64).
    """
    valid = _response_mask(mask, values)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if rewards.dim() == 1:
        rewards = last_token_rewards(rewards, valid)
    elif rewards.shape != values.shape:
        raise ValueError(f"rewards must be [B] or [B, T] = {tuple(values.shape)}, got {tuple(rewards.shape)}")
    dtype = torch.promote_types(values.dtype, torch.float32)
    # torch.where, not a product: padding may hold NaN or inf, which 0 * x would spread.
    r = torch.where(valid, rewards.detach().to(dtype), 0.0)
    v = torch.where(valid, values.detach().to(dtype), 0.0)
    rows = v.shape[0]
    decay = gamma * _per_row_lambda(lam, rows, v)

    advantages = torch.zeros_like(v)
    columns = torch.nonzero(valid.any(dim=0)).squeeze(-1)
    if columns.numel():
        next_value = torch.zeros(rows, dtype=dtype, device=v.device)  # V of the next response token; 0 at the end
        running = torch.zeros_like(next_value)  # A of the next response token
        # Columns after the batch's last response token change nothing; those before it only carry.
        for t in range(int(columns[-1]), int(columns[0]) - 1, -1):
            here = valid[:, t]
            delta = r[:, t] + gamma * next_value - v[:, t]
            running = torch.where(here, delta + decay * running, running)
            next_value = torch.where(here, v[:, t], next_value)
            advantages[:, t] = running
    advantages = torch.where(valid, advantages, 0.0)
    returns = torch.where(valid, advantages + v, 0.0)
    return advantages, returns


def whiten(values: torch.Tensor, mask: torch.Tensor, epsilon: float = WHITEN_EPSILON) -> torch.Tensor:
    """(x − mean)/sqrt(var + epsilon) over the positions where ``mask`` is non-zero (the whole batch), with the
    unbiased variance; 0 elsewhere. Fewer than two positions: variance 0, so the result is 0."""
    valid = mask != 0
    x = torch.where(valid, values, 0.0)
    count = valid.sum()
    mean = x.sum() / count.clamp(min=1)
    centred = torch.where(valid, values - mean, 0.0)
    var = centred.square().sum() / (count - 1).clamp(min=1)
    return centred * torch.rsqrt(var + epsilon)


def length_adaptive_lambda(mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """``[B]`` VAPO's λ_policy = 1 − 1/max(α·l, 1), l = response tokens of the row (``alpha`` > 0)."""
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    lengths = (mask != 0).sum(dim=1).to(torch.float64)
    return 1.0 - 1.0 / (alpha * lengths).clamp(min=1.0)


def compute_advantages_and_returns(
    cfg: GAEConfig, rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages for the policy, returns for the critic), ``[B, T]``, as ``ppo.adv_estimator`` says: returns with
    λ_value, advantages with λ_policy (or the length-adaptive λ), then whitened when ``normalize_advantages``."""
    if cfg.name != "gae":
        raise ValueError(f"adv_estimator.name {cfg.name!r} is not supported; use 'gae'")
    policy_lambda: float | torch.Tensor = cfg.policy_lambda
    if cfg.length_adaptive_alpha > 0:
        policy_lambda = length_adaptive_lambda(mask, cfg.length_adaptive_alpha)
    value_advantages, returns = generalized_advantages(rewards, values, mask, cfg.gae_gamma, cfg.value_lambda)
    if not isinstance(policy_lambda, torch.Tensor) and policy_lambda == cfg.value_lambda:
        advantages = value_advantages  # one λ for both: one pass
    else:
        advantages, _ = generalized_advantages(rewards, values, mask, cfg.gae_gamma, policy_lambda)
    if cfg.normalize_advantages:
        advantages = whiten(advantages, mask)
    return advantages, returns

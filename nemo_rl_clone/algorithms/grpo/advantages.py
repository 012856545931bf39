"""GRPO's advantages of one step (``grpo.adv_estimator``, clamped) and its sample filter on the trainer/engine logprob
mismatch (``grpo.seq_logprob_error_threshold``)."""

from __future__ import annotations

import torch

from nemo_rl_clone.algorithms.advantage_estimator import AdvantageEstimator, adjacent_groups, estimator_class
from nemo_rl_clone.algorithms.grpo.config import GRPOConfig
from nemo_rl_clone.algorithms.loss import ClippedPGLossConfig
from nemo_rl_clone.algorithms.utils import masked_mean
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.rollout.batches import training_sample_mask
from nemo_rl_clone.rollout.rewards import response_length
from nemo_rl_clone.utils.errors import UserInputError


def advantage_estimator(cfg: GRPOConfig, loss_config: ClippedPGLossConfig | None = None) -> AdvantageEstimator:
    """The estimator ``grpo.adv_estimator.name`` names (built in, or a user's class by its dotted path), built as
    NeMo-RL builds it: from the ``adv_estimator`` keys, the flat ``grpo.*`` switches filled in, and the loss config
    (the one place estimators are built)."""
    est = cfg.adv_estimator
    estimator_config = {
        "name": est.name,
        "normalize_rewards": cfg.normalize,
        "use_leave_one_out_baseline": cfg.leave_one_out,
        "minus_baseline": est.minus_baseline,
        "std": est.std,
    }
    cls = estimator_class(est.name)
    return cls(estimator_config, ClippedPGLossConfig() if loss_config is None else loss_config)


def step_advantages(
    rewards: torch.Tensor,
    cfg: GRPOConfig,
    batch: BatchedDataDict | None = None,
    loss_config: ClippedPGLossConfig | None = None,
) -> torch.Tensor:
    """[B] advantages of one step: ``grpo.adv_estimator``'s, then clamped into [advantage_clip_low,
    advantage_clip_high].

    The estimator sees NeMo-RL's inputs: the prompt group of each sample, and a ``[B, L]`` mask with 1 on each
    sample's response tokens (from ``batch``'s message logs, left-aligned) where the sample trains; without
    ``batch`` every sample is one response token that trains. Each sample's advantage is the mean of its token
    advantages over its response tokens: every built-in estimator gives each token of a sample the same value, and an
    estimator whose values vary across a sample's tokens is refused in one line."""
    if batch is None:
        lengths, sample_mask = torch.ones(rewards.shape[0], dtype=torch.long), torch.ones_like(rewards)
    else:
        lengths = torch.tensor([response_length(log) for log in batch["message_log"]], dtype=torch.long)
        sample_mask = training_sample_mask(batch, cfg.overlong_filtering)
    tokens = (torch.arange(max(1, int(lengths.max())))[None, :] < lengths[:, None]).to(rewards.dtype)
    token_advantages = advantage_estimator(cfg, loss_config).compute_advantage(
        prompt_ids=adjacent_groups(rewards.shape[0], cfg.num_generations_per_prompt),
        rewards=rewards,
        mask=tokens * sample_mask.to(rewards.dtype)[:, None],
        repeated_batch=batch if batch is not None else BatchedDataDict(),
        logprobs_policy=None,
        logprobs_reference=None,
    )
    # a sample without response tokens keeps its first column's value (it trains nothing; it is still logged)
    # in float64 a sum of n equal float32 values is exact, so the mean of a constant row is that value exactly
    counts = tokens.double().sum(dim=1)
    means = (token_advantages.double() * tokens).sum(dim=1) / counts.clamp(min=1)
    spread = ((token_advantages.double() - means[:, None]).abs() * tokens).amax(dim=1)
    if bool((spread > 1e-6 * means.abs().clamp(min=1.0)).any()):
        # Averaging them would silently train something else than the estimator computed.
        raise UserInputError(
            f"grpo.adv_estimator.name: {cfg.adv_estimator.name} returned advantages that vary across a sample's "
            "tokens; the trainer takes one advantage per sample (every token of a sample must carry the same value)"
        )
    advantages = torch.where(counts > 0, means, token_advantages[:, 0]).to(rewards.dtype)
    if cfg.advantage_clip_low is not None or cfg.advantage_clip_high is not None:
        advantages = advantages.clamp(min=cfg.advantage_clip_low, max=cfg.advantage_clip_high)
    return advantages


def sequence_mult_prob_error(train_data: BatchedDataDict) -> torch.Tensor:
    """[B] each sample's token_mult_prob_error: the mean over its trainable tokens of exp|lp_gen − lp_prev| (1 is
    exact agreement of the trainer and the generator; 0 for a sample without trainable tokens)."""
    token_mask = train_data["token_mask"][:, 1:]
    gap = (train_data["generation_logprobs"][:, 1:] - train_data["prev_logprobs"][:, 1:]).abs()
    return masked_mean(torch.where(token_mask > 0, gap, 0.0).exp(), token_mask, dim=-1)


def mask_logprob_mismatch(train_data: BatchedDataDict, threshold: float) -> int:
    """Zero ``sample_mask`` of the samples whose `sequence_mult_prob_error` exceeds ``threshold``: the trainer and
    the generator disagree on them too much to trust the importance ratios. Returns how many samples it masked
    (samples masked already are not counted)."""
    drop = (sequence_mult_prob_error(train_data) > threshold) & (train_data["sample_mask"] > 0)
    train_data["sample_mask"] = torch.where(drop, 0.0, train_data["sample_mask"])
    return int(drop.sum())

"""Reward transformations of the rollouts (NeMo-RL v0.7.0 has them at ``nemo_rl.algorithms.reward_functions``), applied
in its order: the environment's reward, scaled (``grpo.reward_scaling``), then shaped (``grpo.reward_shaping``, DAPO's
overlong penalty). Shapes: ``[B]`` rewards, one per sample."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from nemo_rl_clone.environments.interfaces import reward_component_keys

if TYPE_CHECKING:
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.rollout.config import RewardedLoopConfig


def scale_rewards(
    rewards: torch.Tensor, source_min: float, source_max: float, target_min: float, target_max: float
) -> torch.Tensor:
    """Linear map of [source_min, source_max] onto [target_min, target_max]; rewards outside are clamped first."""
    clamped = rewards.clamp(min=source_min, max=source_max)
    return target_min + (clamped - source_min) * (target_max - target_min) / (source_max - source_min)


def overlong_penalty(
    response_lengths: torch.Tensor, max_response_length: int, buffer_length: int, penalty: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment [B] (≤ 0), to be added to the rewards.

    0 up to ``max_response_length − buffer_length`` tokens, then falling linearly to ``−penalty`` at
    ``max_response_length`` (and staying there beyond it).
    """
    start = max_response_length - buffer_length
    excess = (response_lengths.to(torch.float32) - start).clamp(min=0) / max(buffer_length, 1)
    return -penalty * excess.clamp(max=1.0)


def process_rewards(batch: BatchedDataDict, cfg: RewardedLoopConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards, unshaped) per sample, in NeMo-RL v0.7.0's order: the environment's total reward, optionally scaled,
    then optionally shaped (the overlong penalty). ``unshaped`` is the scaled reward before shaping: what dynamic
    sampling judges, so that an all-correct group with one overlong answer is not taken for signal. Scaling also
    rescales the batch's reward components (``reward1`` ...) in place; shaping leaves them as they are. Sets
    ``batch["accuracy_reward"]`` (`accuracy_reward`, unscaled)."""
    rewards = batch["total_reward"].clone().float()
    batch["accuracy_reward"] = accuracy_reward(batch).clone()  # before scaling rescales the components in place
    if cfg.reward_scaling.enabled:
        s = cfg.reward_scaling
        rewards = scale_rewards(rewards, s.source_min, s.source_max, s.target_min, s.target_max)
        for key in reward_component_keys(batch):  # GDPO's inputs, scaled as NeMo-RL does (in the batch)
            batch[key] = scale_rewards(batch[key].float(), s.source_min, s.source_max, s.target_min, s.target_max)
    unshaped = rewards.clone()
    if cfg.reward_shaping.enabled:
        shaping = cfg.reward_shaping
        assert shaping.max_response_length is not None  # RewardShapingConfig.check requires it when enabled
        lengths = torch.tensor([response_length(log) for log in batch["message_log"]])
        rewards = rewards + overlong_penalty(
            lengths, shaping.max_response_length, shaping.overlong_buffer_length, shaping.overlong_buffer_penalty
        )
    return rewards, unshaped


def accuracy_reward(batch: BatchedDataDict) -> torch.Tensor:
    """[B] the environment's reward that `accuracy` counts (a sample is correct where it is 1): ``total_reward``,
    or the first reward component where the environment returned several (``math_multi_reward``: correctness),
    since their sum (0 to 3 there) is not a verdict."""
    keys = reward_component_keys(batch)
    return (batch[keys[0]] if keys else batch["total_reward"]).float()


def response_length(message_log: list[dict[str, Any]]) -> int:
    """Tokens a sample generated: its assistant messages' token ids, over all turns."""
    return sum(len(m["token_ids"]) for m in message_log if m["role"] == "assistant")

"""Reward transformations of the rollouts (NeMo-RL v0.7.0 has them at ``nemo_rl.algorithms.reward_functions``), applied
in its order: the environment's reward, scaled (``grpo.reward_scaling``), then shaped (``grpo.reward_shaping``: DAPO's
overlong penalty, or ProRL's stop-properly penalty in its place). Shapes: ``[B]`` rewards, one per sample."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import torch

from nemo_rl_clone.environments.interfaces import reward_component_keys
from nemo_rl_clone.utils.config_sections import section_value
from nemo_rl_clone.utils.errors import UserInputError

if TYPE_CHECKING:
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.rollout.config import RewardedLoopConfig, RewardShapingConfig

# NeMo-RL's name of a tensor type variable in this module.
Tensor = TypeVar("Tensor", bound=torch.Tensor)
_DAPO_KEYS = ("overlong_buffer_length", "overlong_buffer_penalty", "max_response_length")


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


def stop_properly_penalty(rewards: torch.Tensor, truncated: torch.Tensor, coef: float) -> torch.Tensor:
    """ProRL's "stop properly" shaping [B]: the reward of a response that hit the token limit (``truncated``) times
    ``coef`` (0: no reward for it, 1: unchanged); the others' as they are."""
    return torch.where(truncated.to(torch.bool), rewards * coef, rewards)


def process_rewards(batch: BatchedDataDict, cfg: RewardedLoopConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards, unshaped) per sample, in NeMo-RL v0.7.0's order: the environment's total reward, optionally scaled,
    then optionally shaped (the overlong or the stop-properly penalty). ``unshaped`` is the scaled reward before shaping: what dynamic
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
    shaping = cfg.reward_shaping
    if shaping.enabled and shaping.stop_properly_penalty_coef is not None:
        rewards = stop_properly_penalty(rewards, batch["truncated"], shaping.stop_properly_penalty_coef)
    elif shaping.enabled:
        assert shaping.max_response_length is not None  # RewardShapingConfig.check requires it when enabled
        lengths = response_lengths(batch)
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


def response_lengths(batch: BatchedDataDict) -> torch.Tensor:
    """[B] tokens each sample generated: ``batch["response_token_lengths"]`` where the batch carries it (NeMo-RL's
    key), else counted from the message logs (`response_length`)."""
    given = batch.get("response_token_lengths")
    if given is not None:
        return torch.as_tensor(given)
    return torch.tensor([response_length(log) for log in batch["message_log"]])


def apply_reward_shaping(batch: BatchedDataDict, cfg: RewardShapingConfig | dict[str, Any]) -> BatchedDataDict:
    """NeMo-RL's reward-shaping entry point, on ``batch["total_reward"]`` in place; returns ``batch``. ``cfg``: the
    ``reward_shaping`` section, a dict or the typed section. Disabled: the batch as it was. Enabled: the rewards
    before shaping are kept as ``batch["unshaped_total_reward"]`` (dynamic sampling judges those); then, with
    ``stop_properly_penalty_coef`` set (in [0, 1]), `stop_properly_penalty` on ``batch["truncated"]`` and nothing else;
    otherwise DAPO's overlong penalty (`overlong_penalty`), for which ``overlong_buffer_length``,
    ``overlong_buffer_penalty`` (>= 0) and ``max_response_length`` are required."""
    if not section_value(cfg, "enabled", False):
        return batch
    coef = section_value(cfg, "stop_properly_penalty_coef")
    rewards = batch["total_reward"]
    if coef is not None:
        if not 0.0 <= coef <= 1.0:
            raise UserInputError(f"reward_shaping.stop_properly_penalty_coef: must be in [0, 1], got {coef}")
        truncated = batch.get("truncated")
        if truncated is None:
            raise UserInputError(
                "batch: no 'truncated' (which responses hit the token limit) for stop_properly_penalty_coef"
            )
        batch["unshaped_total_reward"] = rewards.clone()
        truncated = torch.as_tensor(truncated, dtype=torch.bool, device=rewards.device)
        batch["total_reward"] = stop_properly_penalty(rewards, truncated, float(coef)).to(rewards.dtype)
        return batch
    missing = [key for key in _DAPO_KEYS if section_value(cfg, key) is None]
    if missing:
        raise UserInputError(*(f"reward_shaping.{key}: required when reward shaping is enabled" for key in missing))
    buffer_length, penalty, max_length = (section_value(cfg, key) for key in _DAPO_KEYS)
    if penalty < 0:
        raise UserInputError(f"reward_shaping.overlong_buffer_penalty: must be >= 0, got {penalty}")
    lengths = response_lengths(batch)
    if len(lengths) != len(rewards):
        raise UserInputError(f"batch: {len(lengths)} responses for {len(rewards)} rewards")
    batch["unshaped_total_reward"] = rewards.clone()
    shaped = rewards + overlong_penalty(lengths, int(max_length), int(buffer_length), float(penalty))
    batch["total_reward"] = shaped.to(rewards.dtype)
    return batch

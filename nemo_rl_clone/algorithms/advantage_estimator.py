"""Advantage estimators, chosen by ``grpo.adv_estimator.name`` (NeMo-RL v0.7.0's key and module path).

Every estimator maps one step's rewards to one advantage per sample, ``[B]`` (the trainer spreads it over the
sample's response tokens). Samples are in prompt groups of ``group_size``, adjacent.

- ``grpo``: A = r − baseline, the baseline the group mean or, with ``use_leave_one_out_baseline``, the mean of the
  *other* samples of the group; with ``normalize_rewards`` divided by a std where it is > 0 (a group without
  variance gets A = 0). The std is NeMo-RL's: the unbiased std of the same rewards the baseline averaged (per sample
  with leave-one-out); ``std: group`` takes the unbiased std of the whole group for every sample instead.
- ``rloo``: RLOO (arXiv 2402.14740): the leave-one-out baseline, no std.
- ``reinforce_plus_plus``: REINFORCE++ (arXiv 2501.03262): r minus the group mean (with ``minus_baseline``), then
  normalised over the whole batch, weighting each sample by its response tokens: (a − mean) / sqrt(max(var, 1e-8)).
- ``gdpo``: several rewards per sample (``reward_components``, e.g. correctness and format): each is turned into a
  ``grpo`` advantage on its own, the advantages are summed, and the sum is normalised over the batch to mean 0 and
  (unbiased) std 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from nemo_rl_clone.utils.errors import UserInputError

EPSILON = 1e-6  # added to a std before dividing (NeMo-RL's)


class AdvantageEstimator(Protocol):
    def compute_advantage(
        self,
        rewards: torch.Tensor,
        group_size: int,
        response_lengths: torch.Tensor,
        reward_components: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B]`` advantages of ``rewards`` ``[B]`` (``response_lengths`` ``[B]``: tokens each sample trains)."""
        ...


def _groups(values: torch.Tensor, group_size: int) -> torch.Tensor:
    if values.dim() != 1 or group_size < 1 or values.numel() % group_size:
        raise ValueError(f"rewards must be [B] with B a multiple of group_size={group_size}, got {tuple(values.shape)}")
    return values.double().view(-1, group_size)


def baseline_and_std(
    rewards: torch.Tensor, group_size: int, leave_one_out: bool, std: str = "leave_one_out"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(baseline [B], std [B]) of each sample: the mean of its group's rewards (without its own with
    ``leave_one_out``) and the unbiased std of those same rewards (``std="group"``: of the whole group), 0 where
    undefined. A group of one gets baseline = reward."""
    groups = _groups(rewards, group_size)
    if group_size == 1:
        return rewards.clone(), torch.zeros_like(rewards)
    total, total_sq = groups.sum(dim=1, keepdim=True), groups.square().sum(dim=1, keepdim=True)
    if leave_one_out:
        count = group_size - 1
        mean, mean_sq = (total - groups) / count, (total_sq - groups.square()) / count
    else:
        count = group_size
        mean, mean_sq = (total / count).expand_as(groups), (total_sq / count).expand_as(groups)
    if std == "group":
        spread = groups.std(dim=1, keepdim=True).expand_as(groups)
    elif count > 1:
        spread = ((mean_sq - mean.square()).clamp(min=0) * (count / (count - 1))).sqrt()
    else:
        spread = torch.zeros_like(groups)  # one other sample: no spread to measure
    return mean.reshape(-1).to(rewards.dtype), spread.reshape(-1).to(rewards.dtype)


def _normalised(advantages: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return torch.where(std > 0, advantages / (std + EPSILON), advantages)


@dataclass(frozen=True)
class GRPOAdvantageEstimator:
    leave_one_out: bool = True
    normalize: bool = True
    std: str = "leave_one_out"

    def compute_advantage(
        self,
        rewards: torch.Tensor,
        group_size: int,
        response_lengths: torch.Tensor,
        reward_components: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        baseline, std = baseline_and_std(rewards, group_size, self.leave_one_out, self.std)
        advantages = rewards - baseline
        if self.normalize:
            # A group whose rewards are all equal has A = 0 exactly; where the std is 0 otherwise, A stays unscaled.
            advantages = _normalised(advantages, std)
        return advantages


@dataclass(frozen=True)
class RLOOAdvantageEstimator:
    def compute_advantage(
        self,
        rewards: torch.Tensor,
        group_size: int,
        response_lengths: torch.Tensor,
        reward_components: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return GRPOAdvantageEstimator(leave_one_out=True, normalize=False).compute_advantage(
            rewards, group_size, response_lengths
        )


@dataclass(frozen=True)
class ReinforcePlusPlusAdvantageEstimator:
    minus_baseline: bool = True

    def compute_advantage(
        self,
        rewards: torch.Tensor,
        group_size: int,
        response_lengths: torch.Tensor,
        reward_components: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        advantages = rewards.double()
        if self.minus_baseline:
            advantages = advantages - baseline_and_std(rewards, group_size, leave_one_out=False)[0].double()
        weights = response_lengths.double()
        total = weights.sum().clamp(min=1.0)
        mean = (advantages * weights).sum() / total
        var = ((advantages - mean).square() * weights).sum() / total
        return ((advantages - mean) * var.clamp(min=1e-8).rsqrt()).to(rewards.dtype)


@dataclass(frozen=True)
class GDPOAdvantageEstimator:
    leave_one_out: bool = True
    normalize: bool = True
    std: str = "leave_one_out"

    def compute_advantage(
        self,
        rewards: torch.Tensor,
        group_size: int,
        response_lengths: torch.Tensor,
        reward_components: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if reward_components is None or len(reward_components) < 2:
            found = 0 if reward_components is None else len(reward_components)
            raise UserInputError(
                f"grpo.adv_estimator.name: 'gdpo' needs at least 2 reward components per sample (the environment "
                f"returned {found}); use 'grpo' for a single reward"
            )
        per_reward = GRPOAdvantageEstimator(self.leave_one_out, self.normalize, self.std)
        total = sum(
            per_reward.compute_advantage(component.to(rewards.dtype), group_size, response_lengths)
            for component in reward_components.values()
        )
        assert isinstance(total, torch.Tensor)
        centred = total - total.mean()
        spread = total.std() if total.numel() > 1 else torch.zeros(())
        return centred / spread if spread > 0 else centred


ESTIMATORS: dict[str, Callable[..., AdvantageEstimator]] = {
    "grpo": GRPOAdvantageEstimator,
    "rloo": RLOOAdvantageEstimator,
    "reinforce_plus_plus": ReinforcePlusPlusAdvantageEstimator,
    "gdpo": GDPOAdvantageEstimator,
}

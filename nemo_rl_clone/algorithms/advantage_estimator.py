"""Advantage estimators, chosen by ``grpo.adv_estimator.name`` (NeMo-RL v0.7.0's key, module path and interface).

NeMo-RL's interface, so that a NeMo-RL user's estimator plugs in (``grpo.adv_estimator.name: package.module.Class``):
``Estimator(estimator_config, loss_config)``, then ``compute_advantage(prompt_ids, rewards, mask, **kwargs)``:

- ``prompt_ids``: ``[B]`` (or ``[B, P]``): samples whose rows are equal form a prompt group (here: the group index);
- ``rewards``: ``[B]``, one per sample;
- ``mask``: ``[B, S]`` response-token mask times the sample mask, 0 on padding and on samples that train nothing;
- keyword arguments: ``repeated_batch`` (the step's batch, where GDPO reads ``reward1``, ``reward2``, …),
  ``logprobs_policy`` and ``logprobs_reference`` (``None`` here: advantages come before the logprob pass).

It returns ``[B, S]`` token-level advantages. The built-in estimators:

- ``grpo``: A = r − baseline, the baseline the group mean or, with ``use_leave_one_out_baseline``, the mean of the
  *other* samples of the group; with ``normalize_rewards`` divided by a std where it is > 0 (a group without
  variance gets A = 0). The std is NeMo-RL's: the unbiased std of the same rewards the baseline averaged (per sample
  with leave-one-out); ``std: group`` takes the unbiased std of the whole group for every sample instead. Every
  sample of a group counts, masked or not (as in NeMo-RL).
- ``rloo``: RLOO (arXiv 2402.14740): the leave-one-out baseline, no std.
- ``reinforce_plus_plus``: REINFORCE++ (arXiv 2501.03262): r minus the group mean (with ``minus_baseline``), then
  normalised over the tokens ``mask`` keeps: (a − mean) / sqrt(max(var, 1e-8)). Masked samples and padding do not
  count in the mean and variance.
- ``gdpo``: several rewards per sample (the batch's ``reward1``, ``reward2``, …): each is turned into a ``grpo``
  advantage on its own, the advantages are summed, and the sum is normalised over the batch to mean 0 and
  (unbiased) std 1.

NeMo-RL's PPO estimators are here under its names too, returning ``(advantages, returns)`` as there:
`RawRewardAdvantageEstimator` (returns None) and `GeneralizedAdvantageEstimator`, GAE of
`nemo_rl_clone.algorithms.ppo.gae` (the one PPO trains with). ``OPDAdvantageEstimator`` (on-policy distillation
inside GRPO) is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from nemo_rl_clone.algorithms.ppo.config import GAEConfig
from nemo_rl_clone.algorithms.ppo.gae import compute_advantages_and_returns
from nemo_rl_clone.environments.interfaces import reward_component_keys
from nemo_rl_clone.utils.config_validation import ConfigError, as_config
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.imports import import_by_path
from nemo_rl_clone.utils.registry import Registry, is_import_path
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

EPSILON = 1e-6  # added to a std before dividing (NeMo-RL's)


class AdvantageEstimator(Protocol):
    def compute_advantage(
        self, prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        """``[B, S]`` advantages (``mask``'s shape) of ``rewards`` ``[B]``, grouped by ``prompt_ids``."""
        ...


def adjacent_groups(batch_size: int, group_size: int) -> torch.Tensor:
    """``[B]`` prompt ids of a batch laid out group by group (the n samples of a prompt adjacent)."""
    if group_size < 1 or batch_size % group_size:
        raise ValueError(f"rewards must be [B] with B a multiple of group_size={group_size}, got ({batch_size},)")
    return torch.arange(batch_size // group_size).repeat_interleave(group_size)


def baseline_and_std(
    rewards: torch.Tensor, prompt_ids: torch.Tensor, leave_one_out: bool, std: str = "leave_one_out"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(baseline [B], std [B]) of each sample: the mean of its group's rewards (without its own with
    ``leave_one_out``) and the unbiased std of those same rewards (``std="group"``: of the whole group), 0 where
    undefined. A group of one gets baseline = reward."""
    if rewards.dim() != 1 or prompt_ids.shape[0] != rewards.shape[0]:
        raise ValueError(f"rewards [B] and prompt_ids [B, ...] must agree on B: {rewards.shape}, {prompt_ids.shape}")
    group = torch.unique(prompt_ids.cpu(), dim=0, return_inverse=True)[1].to(rewards.device)
    values = rewards.double()
    size = torch.bincount(group).double()[group]
    total = torch.zeros_like(size).index_add_(0, group, values)[group]
    total_sq = torch.zeros_like(size).index_add_(0, group, values.square())[group]
    count = size - 1 if leave_one_out else size
    others, others_sq = (total - values, total_sq - values.square()) if leave_one_out else (total, total_sq)
    mean = others / count.clamp(min=1)
    if std == "group":
        spread_of, count_for_std = (total / size, total_sq / size), size
    else:
        spread_of, count_for_std = (mean, others_sq / count.clamp(min=1)), count
    variance = (spread_of[1] - spread_of[0].square()).clamp(min=0) * count_for_std / (count_for_std - 1).clamp(min=1)
    spread = torch.where(count_for_std > 1, variance.sqrt(), 0.0)
    alone = size == 1
    baseline = torch.where(alone, values, mean)
    return baseline.to(rewards.dtype), torch.where(alone, 0.0, spread).to(rewards.dtype)


def _normalised(advantages: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return torch.where(std > 0, advantages / (std + EPSILON), advantages)


def _switch(estimator_config: Mapping[str, Any], key: str, default: Any) -> Any:
    value = estimator_config.get(key)
    return default if value is None else value


class GRPOAdvantageEstimator:
    def __init__(self, estimator_config: Mapping[str, Any], loss_config: Any = None) -> None:
        self.leave_one_out = bool(_switch(estimator_config, "use_leave_one_out_baseline", True))
        self.normalize = bool(_switch(estimator_config, "normalize_rewards", True))
        self.std = str(_switch(estimator_config, "std", "leave_one_out"))

    def per_sample(self, prompt_ids: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        """``[B]``: one advantage per sample."""
        baseline, std = baseline_and_std(rewards, prompt_ids, self.leave_one_out, self.std)
        advantages = rewards - baseline
        # A group whose rewards are all equal has A = 0 exactly; where the std is 0 otherwise, A stays unscaled.
        return _normalised(advantages, std) if self.normalize else advantages

    def compute_advantage(
        self, prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        return self.per_sample(prompt_ids, rewards)[:, None].expand(mask.shape)


class RLOOAdvantageEstimator(GRPOAdvantageEstimator):
    def __init__(self, estimator_config: Mapping[str, Any], loss_config: Any = None) -> None:
        super().__init__({"use_leave_one_out_baseline": True, "normalize_rewards": False}, loss_config)


class ReinforcePlusPlusAdvantageEstimator:
    def __init__(self, estimator_config: Mapping[str, Any], loss_config: Any = None) -> None:
        self.minus_baseline = bool(_switch(estimator_config, "minus_baseline", True))

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        logprobs_policy: torch.Tensor | None = None,
        logprobs_reference: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        # NeMo-RL subtracts a KL term from them only under loss_fn.use_kl_in_reward, which is refused here
        del logprobs_policy, logprobs_reference
        advantages = rewards.double()
        if self.minus_baseline:
            advantages = advantages - baseline_and_std(rewards, prompt_ids, leave_one_out=False)[0].double()
        tokens = advantages[:, None].expand(mask.shape)
        weights = mask.double()
        # an all-masked batch trains nothing; the clamp keeps its advantages finite
        total = weights.sum().clamp(min=1.0)
        mean = (tokens * weights).sum() / total
        var = ((tokens - mean).square() * weights).sum() / total
        return ((tokens - mean) * var.clamp(min=1e-8).rsqrt()).to(rewards.dtype)


class GDPOAdvantageEstimator:
    def __init__(self, estimator_config: Mapping[str, Any], loss_config: Any = None) -> None:
        self.per_reward = GRPOAdvantageEstimator(estimator_config, loss_config)

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        repeated_batch: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        keys = reward_component_keys(repeated_batch or {})
        if len(keys) < 2:
            raise UserInputError(
                f"grpo.adv_estimator.name: 'gdpo' needs at least 2 reward components per sample (reward1, reward2, "
                f"...; the environment returned {len(keys)}); use 'grpo' for a single reward"
            )
        assert repeated_batch is not None
        total = sum(
            self.per_reward.per_sample(prompt_ids, torch.as_tensor(repeated_batch[key]).to(rewards.dtype))
            for key in keys
        )
        assert isinstance(total, torch.Tensor)
        centred = total - total.mean()
        spread = total.std() if total.numel() > 1 else torch.zeros(())
        return (centred / spread if spread > 0 else centred)[:, None].expand(mask.shape)


class RawRewardAdvantageEstimator:
    """NeMo-RL's ``raw_reward``: the reward itself as every token's advantage (no baseline, no critic), with
    ``normalize_advantages`` whitened over the tokens ``mask`` keeps: (a − mean) / sqrt(max(var, 1e-8)), the
    population variance."""

    def __init__(self, estimator_config: Mapping[str, Any], loss_config: Any) -> None:
        self.normalize_advantages = bool(_switch(estimator_config, "normalize_advantages", True))

    def compute_advantage(
        self, prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, **kwargs: Any
    ) -> tuple[torch.Tensor, None]:
        advantages = rewards[:, None].expand(mask.shape)
        if self.normalize_advantages:
            weights = mask.to(advantages.dtype)
            count = weights.sum().clamp(min=1)
            mean = (advantages * weights).sum() / count
            var = ((advantages - mean).square() * weights).sum() / count
            advantages = (advantages - mean) * var.clamp(min=1e-8).rsqrt()
        return advantages, None


def _loss_setting(loss_config: Any, key: str) -> Any:
    if isinstance(loss_config, Mapping):
        return loss_config.get(key)
    return getattr(loss_config, key, None)


class GeneralizedAdvantageEstimator:
    """NeMo-RL's GAE estimator: ``estimator_config`` is PPO's ``ppo.adv_estimator`` section (a dict or `GAEConfig`:
    ``gae_lambda``, ``gae_gamma``, ``normalize_advantages``, ``gae_lambda_value``, ``gae_lambda_policy``,
    ``length_adaptive_alpha``), computed by `compute_advantages_and_returns`."""

    def __init__(self, estimator_config: Mapping[str, Any] | GAEConfig, loss_config: Any) -> None:
        config = as_config(estimator_config, GAEConfig, "adv_estimator")
        problems = [f"adv_estimator.{key}: {message}" for key, message in config.check()]
        if problems:  # a dict was checked by as_config; a GAEConfig built in code is checked here
            raise ConfigError(problems)
        if _loss_setting(loss_config, "use_kl_in_reward"):
            raise UserInputError(
                "loss_fn.use_kl_in_reward: not supported yet: the KL penalty is a loss term here "
                "(reference_policy_kl_penalty); set it to false"
            )
        self.config = config

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        values: torch.Tensor,
        reference_logprobs: torch.Tensor | None = None,
        logprobs: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns), both ``[B, S]``: ``rewards`` ``[B]`` on each row's last ``mask`` token, ``values``
        ``[B, S]`` the critic's. Both are 0 outside ``mask`` (NeMo-RL's returns hold values there; nothing reads
        them)."""
        return compute_advantages_and_returns(self.config, rewards, values, mask)


ESTIMATORS: Registry[type] = Registry("advantage estimator", "grpo.adv_estimator.name")
ESTIMATORS.register("grpo", GRPOAdvantageEstimator)
ESTIMATORS.register("rloo", RLOOAdvantageEstimator)
ESTIMATORS.register("reinforce_plus_plus", ReinforcePlusPlusAdvantageEstimator)
ESTIMATORS.register("gdpo", GDPOAdvantageEstimator)


def estimator_class(name: str) -> type:
    """The estimator class ``name`` names: a registered name, an import path ``"package.module:Class"``, or the
    dotted ``"package.module.Class"`` the docs have always shown (ImportError naming the path)."""
    if name in ESTIMATORS or is_import_path(name):
        return ESTIMATORS.resolve(name)
    found: type = import_by_path(name)
    return found


__getattr__ = refusing_getattr(
    __name__,
    {
        "OPDAdvantageEstimator": (
            "on-policy distillation inside GRPO (distillation is its own run: examples/run_distillation_math.py)"
        )
    },
)

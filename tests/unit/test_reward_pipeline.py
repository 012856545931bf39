"""GRPO's reward pipeline in NeMo-RL v0.7.0's order (`rollout/rewards.py`, `rollout/batches.py`): scaling, then the overlong
shaping; dynamic sampling judges the unshaped reward; `train/accuracy` counts the environment's reward, hand-computed
numbers throughout."""

from __future__ import annotations

import pytest
import torch

from nemo_rl_clone.algorithms.grpo.config import GRPOConfig
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.rollout.batches import aggregate_train_metrics, select_groups
from nemo_rl_clone.rollout.config import RewardScalingConfig, RewardShapingConfig
from nemo_rl_clone.rollout.rewards import process_rewards
from nemo_rl_clone.utils.errors import UserInputError


def _batch(rewards: list[float], lengths: list[int]) -> BatchedDataDict:
    logs = [[{"role": "assistant", "token_ids": torch.zeros(n, dtype=torch.long)}] for n in lengths]
    return BatchedDataDict(total_reward=torch.tensor(rewards), message_log=logs)


def _config() -> GRPOConfig:
    # Scaling clamps into [0, 1]; shaping takes up to 0.5 from responses longer than 8 - 4 tokens (full at 8).
    return GRPOConfig(
        num_generations_per_prompt=4,
        reward_scaling=RewardScalingConfig(
            enabled=True, source_min=0.0, source_max=1.0, target_min=0.0, target_max=1.0
        ),
        reward_shaping=RewardShapingConfig(
            enabled=True, max_response_length=8, overlong_buffer_length=4, overlong_buffer_penalty=0.5
        ),
    )


def test_scaling_comes_before_shaping_so_the_penalty_survives_the_clamp() -> None:
    """A wrong answer (0) of 8 tokens is penalised to −0.5; shaped first, the scaling's clamp would lift it back to 0."""
    rewards, unshaped = process_rewards(_batch([1.0, 0.0, 1.0, 0.0], [8, 8, 2, 6]), _config())
    assert rewards.tolist() == pytest.approx([0.5, -0.5, 1.0, -0.25])
    assert unshaped.tolist() == pytest.approx([1.0, 0.0, 1.0, 0.0])


def test_dynamic_sampling_judges_the_unshaped_reward() -> None:
    """Group 0: all correct, one overlong (its shaped rewards differ, its task rewards do not): no signal. Group 1:
    one wrong answer: signal. Asked for 2 groups: stop with one line naming the keys, or fill when told to."""
    batch = _batch([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0], [8, 2, 2, 2, 2, 2, 2, 2])
    rewards, unshaped = process_rewards(batch, _config())
    assert len(set(rewards[:4].tolist())) > 1  # shaping alone makes group 0 look like signal
    assert select_groups(unshaped, 4, 1, fill=False) == [4, 5, 6, 7]
    with pytest.raises(UserInputError, match=r"only 1 of grpo.num_prompts_per_step=2 prompt groups") as err:
        select_groups(unshaped, 4, 2, fill=False)
    assert "grpo.dynamic_sampling_fill_without_signal=true" in str(err.value)
    assert select_groups(unshaped, 4, 2, fill=True) == [4, 5, 6, 7, 0, 1, 2, 3]


def test_accuracy_counts_the_environments_reward_and_reward_is_the_shaped_mean() -> None:
    batch = _batch([1.0, 0.0, 1.0, 0.0], [8, 8, 2, 6])
    rewards, _ = process_rewards(batch, _config())
    train_data = BatchedDataDict(
        token_mask=torch.ones(4, 3), input_lengths=torch.full((4,), 5), sample_mask=torch.ones(4)
    )
    results = {"all_mb_metrics": {}, "grad_norm": torch.zeros(1)}
    metrics = aggregate_train_metrics(results, train_data, rewards, torch.zeros(4), {}, batch["total_reward"])
    assert metrics["accuracy"] == 0.5  # two correct answers, one of them overlong (shaped to 0.5)
    assert metrics["reward"] == pytest.approx((0.5 - 0.5 + 1.0 - 0.25) / 4)


def test_stop_properly_penalty_scales_truncated_rewards_after_scaling_and_replaces_the_overlong_penalty() -> None:
    """ProRL's shaping (NeMo-RL: the coefficient takes precedence over the overlong keys, which stay set here):
    rewards 1.5 / 1 / 0.5 / 0 clamp to 1 / 1 / 0.5 / 0; the truncated second and third become 0.25 and 0.125; the
    8-token first is not truncated and keeps 1 (the overlong penalty would have taken 0.5 from it)."""
    config = _config()
    config.reward_shaping.stop_properly_penalty_coef = 0.25
    batch = _batch([1.5, 1.0, 0.5, 0.0], [8, 8, 8, 2])
    batch["truncated"] = torch.tensor([False, True, True, True])
    rewards, unshaped = process_rewards(batch, config)
    assert rewards.tolist() == pytest.approx([1.0, 0.25, 0.125, 0.0])
    assert unshaped.tolist() == pytest.approx([1.0, 1.0, 0.5, 0.0])
    config.reward_shaping.enabled = False  # the coefficient alone shapes nothing, as in NeMo-RL
    assert process_rewards(batch, config)[0].tolist() == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert RewardShapingConfig(enabled=True, stop_properly_penalty_coef=0.0).check() == []  # no DAPO keys needed
    assert RewardShapingConfig(stop_properly_penalty_coef=1.5).check() == [
        ("stop_properly_penalty_coef", "must be in [0, 1] or null, got 1.5")
    ]

"""GRPO reward processing and rollout metrics against hand-computed references."""

import pytest
import torch

from nemo_rl_clone.algorithms.rl.batches import combine_rollout_metrics
from nemo_rl_clone.algorithms.utils import (
    baseline_and_std_per_prompt,
    compute_advantages,
    groups_with_signal,
    overlong_penalty,
    scale_rewards,
)


def test_leave_one_out_baseline_and_std_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    baseline, std = baseline_and_std_per_prompt(rewards, group_size=4)
    # group 1: others' means are (0+0+1)/3, (1+0+1)/3, (1+0+1)/3, (1+0+0)/3
    assert torch.allclose(baseline[:4], torch.tensor([1 / 3, 2 / 3, 2 / 3, 1 / 3]))
    assert torch.allclose(baseline[4:], torch.full((4,), 0.5))
    # unbiased std of [1, 0, 0, 1] = sqrt(1/3); a constant group has std 0
    assert torch.allclose(std[:4], torch.full((4,), (1 / 3) ** 0.5))
    assert torch.equal(std[4:], torch.zeros(4))


def test_group_mean_baseline_when_not_leave_one_out():
    baseline, _ = baseline_and_std_per_prompt(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2, leave_one_out=False)
    assert torch.equal(baseline, torch.tensor([0.5, 0.5, 0.5, 0.5]))


def test_advantages_by_hand_and_zero_variance_groups_are_zero_not_nan():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = compute_advantages(rewards, group_size=4, normalize=True, eps=0.0)
    std = 0.5  # unbiased std of [1, 0, 0, 0]
    expected_first = torch.tensor([1 - 0, 0 - 1 / 3, 0 - 1 / 3, 0 - 1 / 3]) / std
    assert torch.allclose(adv[:4], expected_first, atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(8))
    assert not torch.isnan(adv).any()
    raw = compute_advantages(rewards, group_size=4, normalize=False)
    assert torch.allclose(raw[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def test_single_generation_groups_have_zero_advantage():
    assert torch.equal(compute_advantages(torch.tensor([1.0, 0.0]), group_size=1), torch.zeros(2))


def test_bad_group_layout_is_one_clear_error():
    with pytest.raises(ValueError, match=r"multiple of group_size=4, got \(6,\)"):
        compute_advantages(torch.zeros(6), group_size=4)


def test_reward_scaling_and_clamping():
    out = scale_rewards(torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0]), 0.0, 1.0, -1.0, 1.0)
    assert torch.allclose(out, torch.tensor([-1.0, -1.0, 0.0, 1.0, 1.0]))


def test_overlong_penalty_ramp():
    lengths = torch.tensor([10, 96, 112, 128, 200])
    out = overlong_penalty(lengths, max_response_length=128, buffer_length=32, penalty=1.0)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))


def test_groups_with_signal():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert groups_with_signal(rewards, 2).tolist() == [False, True, False]


def test_rollout_metrics_of_several_generation_batches_weight_means_by_size_and_sum_totals():
    # Dynamic sampling drew a batch of 8 samples, then one of 4: the step's metrics describe all 12.
    first = {"mean_generation_length": 10.0, "truncation_rate": 0.5, "total_generated_tokens": 80.0}
    second = {"mean_generation_length": 4.0, "truncation_rate": 0.0, "total_generated_tokens": 16.0}
    combined = combine_rollout_metrics([first, second], sizes=[8, 4])
    assert combined == {
        "mean_generation_length": 8.0,
        "truncation_rate": pytest.approx(1 / 3),
        "total_generated_tokens": 96.0,
    }
    assert combined["total_generated_tokens"] / 12 == combined["mean_generation_length"]
    assert combine_rollout_metrics([first], sizes=[8]) == first

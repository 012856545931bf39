"""GRPO reward processing and rollout metrics against hand-computed references."""

import pytest
import torch

from nemo_rl_clone.algorithms.advantage_estimator import (
    GDPOAdvantageEstimator,
    GRPOAdvantageEstimator,
    ReinforcePlusPlusAdvantageEstimator,
    RLOOAdvantageEstimator,
    baseline_and_std,
)
from nemo_rl_clone.algorithms.grpo.batches import combine_rollout_metrics
from nemo_rl_clone.algorithms.reward_functions import overlong_penalty, scale_rewards
from nemo_rl_clone.algorithms.utils import (
    groups_with_signal,
)
from nemo_rl_clone.utils.errors import UserInputError


def test_leave_one_out_baseline_and_per_sample_std_by_hand():
    """NeMo-RL's leave-one-out: sample i's baseline and std are those of the *other* samples of its group."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    baseline, std = baseline_and_std(rewards, group_size=4, leave_one_out=True)
    # group 1: the others of sample 0 are [0, 0, 1] (mean 1/3, unbiased std sqrt(1/3)); of sample 1: [1, 0, 1]
    assert torch.allclose(baseline[:4], torch.tensor([1 / 3, 2 / 3, 2 / 3, 1 / 3]))
    assert torch.allclose(std[:4], torch.full((4,), (1 / 3) ** 0.5))
    assert torch.allclose(baseline[4:], torch.full((4,), 0.5)) and torch.equal(std[4:], torch.zeros(4))
    # std="group": the whole group's unbiased std, sqrt(1/3) for [1, 0, 0, 1] as well
    _, group_std = baseline_and_std(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, leave_one_out=True, std="group")
    assert torch.allclose(group_std, torch.full((4,), 0.5))


def test_group_mean_baseline_when_not_leave_one_out():
    baseline, std = baseline_and_std(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2, leave_one_out=False)
    assert torch.equal(baseline, torch.tensor([0.5, 0.5, 0.5, 0.5]))
    assert torch.allclose(std, torch.full((4,), 0.5**0.5))  # unbiased std of [1, 0]


def test_grpo_advantages_by_hand_and_zero_variance_groups_are_zero_not_nan():
    """One success in four: NeMo-RL's per-sample std leaves the success's advantage unscaled (its others have no
    spread) and divides the failures' by sqrt(1/3); the group std would give the success 2.0 instead."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = GRPOAdvantageEstimator().compute_advantage(rewards, 4, torch.ones(12))
    failure = -(1 / 3) / ((1 / 3) ** 0.5 + 1e-6)
    assert torch.allclose(adv[:4], torch.tensor([1.0, failure, failure, failure]), atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(8)) and not torch.isnan(adv).any()
    group = GRPOAdvantageEstimator(std="group").compute_advantage(rewards, 4, torch.ones(12))
    assert torch.allclose(group[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]) / (0.5 + 1e-6), atol=1e-6)
    raw = GRPOAdvantageEstimator(normalize=False).compute_advantage(rewards, 4, torch.ones(12))
    assert torch.allclose(raw[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def test_rloo_is_the_leave_one_out_baseline_without_a_std():
    adv = RLOOAdvantageEstimator().compute_advantage(torch.tensor([1.0, 0.0, 0.5, 0.5]), 2, torch.ones(4))
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_reinforce_plus_plus_normalises_over_the_batch_weighted_by_tokens():
    """Group means 0.5 and 0 → [0.5, −0.5, 0, 0]; weights (tokens) [1, 3, 2, 2]: mean −1/8, var = 23/64 ... by hand."""
    rewards, lengths = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([1.0, 3.0, 2.0, 2.0])
    adv = ReinforcePlusPlusAdvantageEstimator().compute_advantage(rewards, 2, lengths)
    centred = [0.5, -0.5, 0.0, 0.0]
    mean = (0.5 * 1 - 0.5 * 3) / 8
    var = sum(w * (a - mean) ** 2 for a, w in zip(centred, [1, 3, 2, 2], strict=True)) / 8
    assert torch.allclose(adv, torch.tensor([(a - mean) / var**0.5 for a in centred]), atol=1e-6)
    no_baseline = ReinforcePlusPlusAdvantageEstimator(minus_baseline=False).compute_advantage(rewards, 2, lengths)
    raw_mean, raw_var = 1 / 8, (1 * (7 / 8) ** 2 + 7 * (1 / 8) ** 2) / 8
    assert torch.allclose(no_baseline[:2], torch.tensor([7 / 8, -1 / 8]) / raw_var**0.5, atol=1e-6)
    assert raw_mean == pytest.approx(1 / 8)


def test_gdpo_normalises_each_reward_then_the_sum():
    """Two rewards per sample, groups of 2 (leave-one-out, std undefined with one other: unscaled): correctness
    [1, 0 | 1, 1] → [1, −1, 0, 0]; format [1, 1 | 0, 1] → [0, 0, −1, 1]; sum [1, −1, −1, 1] (mean 0, unbiased std
    sqrt(4/3)) → [1, −1, −1, 1] / sqrt(4/3)."""
    components = {"correct": torch.tensor([1.0, 0.0, 1.0, 1.0]), "format": torch.tensor([1.0, 1.0, 0.0, 1.0])}
    adv = GDPOAdvantageEstimator().compute_advantage(torch.zeros(4), 2, torch.ones(4), components)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]) / (4 / 3) ** 0.5, atol=1e-6)
    with pytest.raises(UserInputError, match="'gdpo' needs at least 2 reward components"):
        GDPOAdvantageEstimator().compute_advantage(torch.zeros(4), 2, torch.ones(4), {"correct": torch.zeros(4)})


def test_single_generation_groups_have_zero_advantage():
    adv = GRPOAdvantageEstimator().compute_advantage(torch.tensor([1.0, 0.0]), 1, torch.ones(2))
    assert torch.equal(adv, torch.zeros(2))


def test_bad_group_layout_is_one_clear_error():
    with pytest.raises(ValueError, match=r"multiple of group_size=4, got \(6,\)"):
        GRPOAdvantageEstimator().compute_advantage(torch.zeros(6), 4, torch.ones(6))


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

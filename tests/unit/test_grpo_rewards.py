"""GRPO reward processing and rollout metrics against hand-computed references."""

from typing import ClassVar

import pytest
import torch

from nemo_rl_clone.algorithms.advantage_estimator import (
    GDPOAdvantageEstimator,
    GRPOAdvantageEstimator,
    ReinforcePlusPlusAdvantageEstimator,
    RLOOAdvantageEstimator,
    adjacent_groups,
    baseline_and_std,
)
from nemo_rl_clone.algorithms.grpo.advantages import step_advantages
from nemo_rl_clone.algorithms.grpo.config import AdvEstimatorConfig, GRPOConfig
from nemo_rl_clone.algorithms.loss import ClippedPGLossConfig
from nemo_rl_clone.algorithms.utils import (
    groups_with_signal,
)
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.rollout.batches import combine_rollout_metrics
from nemo_rl_clone.rollout.rewards import overlong_penalty, scale_rewards
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config
from nemo_rl_clone.utils.errors import UserInputError


def per_sample(estimator, rewards, group_size, lengths=None, **kwargs):
    """NeMo-RL's call on adjacent groups of ``group_size`` with a left-aligned mask of ``lengths`` response tokens
    (default 1 each); the [B, S] result is constant along each row, so column 0 is each sample's advantage."""
    lengths = torch.ones(rewards.shape[0], dtype=torch.long) if lengths is None else lengths.long()
    mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).float()
    prompt_ids = adjacent_groups(rewards.shape[0], group_size)
    tokens = estimator.compute_advantage(prompt_ids, rewards, mask, **kwargs)
    assert tokens.shape == mask.shape and torch.equal(tokens, tokens[:, :1].expand_as(tokens))
    return tokens[:, 0]


def test_leave_one_out_baseline_and_per_sample_std_by_hand():
    """NeMo-RL's leave-one-out: sample i's baseline and std are those of the *other* samples of its group."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    baseline, std = baseline_and_std(rewards, adjacent_groups(8, 4), leave_one_out=True)
    # group 1: the others of sample 0 are [0, 0, 1] (mean 1/3, unbiased std sqrt(1/3)); of sample 1: [1, 0, 1]
    assert torch.allclose(baseline[:4], torch.tensor([1 / 3, 2 / 3, 2 / 3, 1 / 3]))
    assert torch.allclose(std[:4], torch.full((4,), (1 / 3) ** 0.5))
    assert torch.allclose(baseline[4:], torch.full((4,), 0.5)) and torch.equal(std[4:], torch.zeros(4))
    # std="group": the whole group's unbiased std, sqrt(1/3) for [1, 0, 0, 1] as well
    _, group_std = baseline_and_std(torch.tensor([1.0, 0.0, 0.0, 0.0]), adjacent_groups(4, 4), True, std="group")
    assert torch.allclose(group_std, torch.full((4,), 0.5))


def test_group_mean_baseline_when_not_leave_one_out():
    baseline, std = baseline_and_std(torch.tensor([1.0, 0.0, 0.0, 1.0]), adjacent_groups(4, 2), leave_one_out=False)
    assert torch.equal(baseline, torch.tensor([0.5, 0.5, 0.5, 0.5]))
    assert torch.allclose(std, torch.full((4,), 0.5**0.5))  # unbiased std of [1, 0]


def test_grpo_advantages_by_hand_and_zero_variance_groups_are_zero_not_nan():
    """One success in four: NeMo-RL's per-sample std leaves the success's advantage unscaled (its others have no
    spread) and divides the failures' by sqrt(1/3); the group std would give the success 2.0 instead."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = per_sample(GRPOAdvantageEstimator({}), rewards, 4)
    failure = -(1 / 3) / ((1 / 3) ** 0.5 + 1e-6)
    assert torch.allclose(adv[:4], torch.tensor([1.0, failure, failure, failure]), atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(8)) and not torch.isnan(adv).any()
    group = per_sample(GRPOAdvantageEstimator({"std": "group"}), rewards, 4)
    assert torch.allclose(group[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]) / (0.5 + 1e-6), atol=1e-6)
    raw = per_sample(GRPOAdvantageEstimator({"normalize_rewards": False}), rewards, 4)
    assert torch.allclose(raw[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def test_rloo_is_the_leave_one_out_baseline_without_a_std():
    adv = per_sample(RLOOAdvantageEstimator({}), torch.tensor([1.0, 0.0, 0.5, 0.5]), 2)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_reinforce_plus_plus_normalises_over_the_batch_weighted_by_tokens():
    """Group means 0.5 and 0 → [0.5, −0.5, 0, 0]; weights (tokens) [1, 3, 2, 2]: mean −1/8, var = 23/64 ... by hand."""
    rewards, lengths = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([1.0, 3.0, 2.0, 2.0])
    adv = per_sample(ReinforcePlusPlusAdvantageEstimator({}), rewards, 2, lengths)
    centred = [0.5, -0.5, 0.0, 0.0]
    mean = (0.5 * 1 - 0.5 * 3) / 8
    var = sum(w * (a - mean) ** 2 for a, w in zip(centred, [1, 3, 2, 2], strict=True)) / 8
    assert torch.allclose(adv, torch.tensor([(a - mean) / var**0.5 for a in centred]), atol=1e-6)
    no_baseline = per_sample(ReinforcePlusPlusAdvantageEstimator({"minus_baseline": False}), rewards, 2, lengths)
    raw_mean, raw_var = 1 / 8, (1 * (7 / 8) ** 2 + 7 * (1 / 8) ** 2) / 8
    assert torch.allclose(no_baseline[:2], torch.tensor([7 / 8, -1 / 8]) / raw_var**0.5, atol=1e-6)
    assert raw_mean == pytest.approx(1 / 8)


def test_gdpo_normalises_each_reward_then_the_sum():
    """Two rewards per sample, groups of 2 (leave-one-out, std undefined with one other: unscaled): correctness
    [1, 0 | 1, 1] → [1, −1, 0, 0]; format [1, 1 | 0, 1] → [0, 0, −1, 1]; sum [1, −1, −1, 1] (mean 0, unbiased std
    sqrt(4/3)) → [1, −1, −1, 1] / sqrt(4/3)."""
    components = {"reward1": torch.tensor([1.0, 0.0, 1.0, 1.0]), "reward2": torch.tensor([1.0, 1.0, 0.0, 1.0])}
    adv = per_sample(GDPOAdvantageEstimator({}), torch.zeros(4), 2, repeated_batch=components)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]) / (4 / 3) ** 0.5, atol=1e-6)
    with pytest.raises(UserInputError, match="'gdpo' needs at least 2 reward components"):
        per_sample(GDPOAdvantageEstimator({}), torch.zeros(4), 2, repeated_batch={"reward1": torch.zeros(4)})


def test_reinforce_plus_plus_leaves_masked_samples_and_padding_out_of_the_normalisation():
    """Groups [1, 0 | 0, 1 | 100, 0]; sample 4 (reward 100) trains nothing (sample_mask 0); response tokens
    [1, 2, 1, 1, 3, 2] in a [6, 3] mask, the rest padding. Without the baseline the 7 valid tokens hold
    1, 0, 0, 0, 1, 0, 0: mean 2/7, var (2·(5/7)² + 5·(2/7)²) / 7 = 10/49, so a reward r gives (r − 2/7)·7/√10."""
    rewards, lengths = torch.tensor([1.0, 0.0, 0.0, 1.0, 100.0, 0.0]), torch.tensor([1, 2, 1, 1, 3, 2])
    tokens = (torch.arange(3)[None, :] < lengths[:, None]).float()
    mask = tokens * torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0])[:, None]
    raw = ReinforcePlusPlusAdvantageEstimator({"minus_baseline": False}).compute_advantage(
        adjacent_groups(6, 2), rewards, mask
    )
    valid = [0, 1, 2, 3, 5]
    expected = [(r - 2 / 7) * 7 / 10**0.5 for r in [1.0, 0.0, 0.0, 1.0, 0.0]]
    assert torch.allclose(raw[valid], torch.tensor(expected)[:, None].expand(5, 3), atol=1e-6, rtol=0)
    # with the group-mean baseline (every sample of a group counts in it, as in NeMo-RL): the valid tokens hold
    # 0.5 | −0.5 −0.5 | −0.5 | 0.5 | −50 −50, weighted by their token counts
    centred, weights = [0.5, -0.5, -0.5, 0.5, -50.0], [1, 2, 1, 1, 2]
    mean = sum(a * w for a, w in zip(centred, weights, strict=True)) / 7
    var = sum(w * (a - mean) ** 2 for a, w in zip(centred, weights, strict=True)) / 7
    adv = per_sample(ReinforcePlusPlusAdvantageEstimator({}), rewards, 2, lengths * mask[:, 0].long())
    assert torch.allclose(adv[valid], torch.tensor([(a - mean) / var**0.5 for a in centred]), atol=1e-6, rtol=0)


def message_batch(lengths: list[int], loss_multiplier: list[float]) -> BatchedDataDict:
    """A batch of one-turn samples whose responses are ``lengths`` tokens long."""
    logs = [
        [{"role": "user", "token_ids": torch.tensor([7, 8])}, {"role": "assistant", "token_ids": torch.ones(n)}]
        for n in lengths
    ]
    truncated = torch.zeros(len(lengths), dtype=torch.bool)
    return BatchedDataDict(message_log=logs, loss_multiplier=torch.tensor(loss_multiplier), truncated=truncated)


def test_step_advantages_leave_samples_that_train_nothing_out_of_reinforce_plus_plus():
    """The trainer's path: sample 4's loss multiplier is 0, so its reward 100 must not shift the others' (same
    numbers as above: valid tokens 1, 0, 0, 0, 1, 0, 0 without the baseline)."""
    cfg = GRPOConfig(
        num_generations_per_prompt=2,
        adv_estimator=AdvEstimatorConfig(name="reinforce_plus_plus", minus_baseline=False),
    )
    batch = message_batch([1, 2, 1, 1, 3, 2], [1.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    adv = step_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 100.0, 0.0]), cfg, batch)
    expected = [(r - 2 / 7) * 7 / 10**0.5 for r in [1.0, 0.0, 0.0, 1.0, 0.0]]
    assert torch.allclose(adv[[0, 1, 2, 3, 5]], torch.tensor(expected), atol=1e-6, rtol=0)


class DoubledRewardEstimator:
    """A user's estimator with NeMo-RL's interface: A = 2·r on every token (records what it was given)."""

    seen: ClassVar[dict] = {}

    def __init__(self, estimator_config, loss_config):
        DoubledRewardEstimator.seen = {"config": estimator_config, "loss": loss_config}

    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        DoubledRewardEstimator.seen.update(prompt_ids=prompt_ids, mask=mask, kwargs=kwargs)
        return (2 * rewards)[:, None].expand(mask.shape)


def test_a_user_estimator_class_plugs_in_by_its_import_path():
    path = f"{__name__}.DoubledRewardEstimator"
    cfg = validate_config({"num_generations_per_prompt": 2, "adv_estimator": {"name": path}}, GRPOConfig)
    batch = message_batch([1, 3, 2, 2], [1.0, 1.0, 0.0, 1.0])
    adv = step_advantages(torch.tensor([1.0, 0.0, 0.5, 0.25]), cfg, batch, ClippedPGLossConfig(ratio_clip_min=0.1))
    assert torch.equal(adv, torch.tensor([2.0, 0.0, 1.0, 0.5]))
    seen = DoubledRewardEstimator.seen
    assert seen["config"]["name"] == path and seen["config"]["use_leave_one_out_baseline"] is True
    assert seen["loss"].ratio_clip_min == 0.1
    assert torch.equal(seen["prompt_ids"], torch.tensor([0, 0, 1, 1]))
    # response tokens times the sample mask, NeMo-RL's `mask`
    assert torch.equal(seen["mask"], torch.tensor([[1.0, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0]]))
    assert seen["kwargs"]["repeated_batch"] is batch and seen["kwargs"]["logprobs_policy"] is None


class PositionalEstimator(DoubledRewardEstimator):
    """A user's estimator whose advantages grow along the response (per-token, like a GAE)."""

    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        return rewards[:, None] + torch.arange(mask.shape[1], dtype=rewards.dtype)[None, :]


def test_a_user_estimator_with_per_token_advantages_is_refused_not_averaged():
    cfg = validate_config(
        {"num_generations_per_prompt": 2, "adv_estimator": {"name": f"{__name__}.PositionalEstimator"}}, GRPOConfig
    )
    batch = message_batch([1, 3, 2, 2], [1.0, 1.0, 1.0, 1.0])
    with pytest.raises(UserInputError, match=r"^grpo.adv_estimator.name: .*vary across a sample's tokens"):
        step_advantages(torch.tensor([1.0, 0.0, 0.5, 0.25]), cfg, batch)


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("reinforce", "must be one of 'grpo', 'rloo', 'reinforce_plus_plus', 'gdpo', 'opd' or a class path"),
        ("nemo_rl_clone.NoSuchEstimator", "cannot import 'nemo_rl_clone.NoSuchEstimator'"),
        ("torch.tensor", "torch.tensor is not a class with compute_advantage(prompt_ids, rewards, mask, **kwargs)"),
    ],
)
def test_an_unknown_estimator_is_one_line_naming_the_key(name, line):
    with pytest.raises(ConfigError) as error:
        validate_config({"adv_estimator": {"name": name}}, GRPOConfig)
    assert len(error.value.problems) == 1 and error.value.problems[0].startswith(f"adv_estimator.name: {line}")


def test_single_generation_groups_have_zero_advantage():
    adv = per_sample(GRPOAdvantageEstimator({}), torch.tensor([1.0, 0.0]), 1)
    assert torch.equal(adv, torch.zeros(2))


def test_bad_group_layout_is_one_clear_error():
    with pytest.raises(ValueError, match=r"multiple of group_size=4, got \(6,\)"):
        per_sample(GRPOAdvantageEstimator({}), torch.zeros(6), 4)


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

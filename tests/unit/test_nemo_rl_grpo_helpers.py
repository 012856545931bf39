"""NeMo-RL v0.7.0's reward and batch helpers at its paths (``nemo_rl.algorithms.reward_functions``, ``.grpo``,
``.ppo``): NeMo-RL's behaviour on tiny hand-computed inputs, configs given as NeMo-RL's dicts and as our sections."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from nemo_rl_clone.algorithms import grpo, ppo, reward_functions
from nemo_rl_clone.algorithms.grpo.config import AdvEstimatorConfig, AsyncGRPOConfig, GRPOConfig
from nemo_rl_clone.algorithms.ppo.config import GAEConfig
from nemo_rl_clone.algorithms.run.rollout import validate as run_validate
from nemo_rl_clone.algorithms.run.rollout import validation_metrics
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.rollout.config import RewardScalingConfig, RewardShapingConfig
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.logger import LoggerConfig
from nemo_rl_clone.utils.timer import Timer


def _message(role: str, tokens: int, **extra: torch.Tensor) -> dict:
    return {"role": role, "content": "", "token_ids": torch.arange(tokens), **extra}


def _answers(*lengths: int) -> list[list[dict]]:
    return [[_message("user", 2), _message("assistant", n)] for n in lengths]


# --------------------------------------------------------------------------------------------- reward shaping
DAPO = {"enabled": True, "overlong_buffer_length": 2, "overlong_buffer_penalty": 1.0, "max_response_length": 6}


def test_apply_reward_shaping_subtracts_dapo_overlong_penalty_and_keeps_the_unshaped_rewards() -> None:
    # penalty starts after 6 - 2 = 4 tokens: 3 → 0, 5 → -0.5, 6 → -1, 8 → -1 (DAPO's formula stays at -penalty)
    batch = BatchedDataDict(message_log=_answers(3, 5, 6, 8), total_reward=torch.tensor([1.0, 1.0, 0.0, 1.0]))
    shaped = reward_functions.apply_reward_shaping(batch, dict(DAPO))
    assert shaped is batch
    torch.testing.assert_close(batch["total_reward"], torch.tensor([1.0, 0.5, -1.0, 0.0]))
    torch.testing.assert_close(batch["unshaped_total_reward"], torch.tensor([1.0, 1.0, 0.0, 1.0]))


def test_apply_reward_shaping_reads_response_token_lengths_and_typed_sections() -> None:
    batch = BatchedDataDict(
        message_log=_answers(1, 1), total_reward=torch.tensor([1.0, 1.0]), response_token_lengths=torch.tensor([5, 3])
    )
    typed = RewardShapingConfig(
        enabled=True, overlong_buffer_length=2, overlong_buffer_penalty=2.0, max_response_length=6
    )
    reward_functions.apply_reward_shaping(batch, typed)
    torch.testing.assert_close(batch["total_reward"], torch.tensor([0.0, 1.0]))  # 5 tokens: 1 over → -2 * 1/2


def test_apply_reward_shaping_stop_properly_scales_truncated_rewards_only() -> None:
    """NeMo-RL's ProRL shaping: with the coefficient set the overlong keys are not applied (the 8-token answer is
    not truncated and keeps its 1); truncated rewards 1 and 0.5 times 0.1."""
    batch = BatchedDataDict(
        message_log=_answers(8, 2, 2), total_reward=torch.tensor([1.0, 1.0, 0.5]), truncated=[False, True, True]
    )
    reward_functions.apply_reward_shaping(batch, {**DAPO, "stop_properly_penalty_coef": 0.1})
    torch.testing.assert_close(batch["total_reward"], torch.tensor([1.0, 0.1, 0.05]))
    torch.testing.assert_close(batch["unshaped_total_reward"], torch.tensor([1.0, 1.0, 0.5]))


def test_apply_reward_shaping_disabled_leaves_the_batch_and_bad_sections_name_the_key() -> None:
    batch = BatchedDataDict(message_log=_answers(9), total_reward=torch.tensor([1.0]))
    reward_functions.apply_reward_shaping(batch, {"enabled": False})
    assert batch["total_reward"].tolist() == [1.0] and "unshaped_total_reward" not in batch
    with pytest.raises(UserInputError, match=r"reward_shaping\.max_response_length: required"):
        reward_functions.apply_reward_shaping(
            batch, {"enabled": True, "overlong_buffer_length": 2, "overlong_buffer_penalty": 1}
        )
    with pytest.raises(UserInputError, match=r"stop_properly_penalty_coef: must be in \[0, 1\], got 1.5"):
        reward_functions.apply_reward_shaping(batch, {**DAPO, "stop_properly_penalty_coef": 1.5})
    with pytest.raises(UserInputError, match="batch: no 'truncated'"):
        reward_functions.apply_reward_shaping(batch, {**DAPO, "stop_properly_penalty_coef": 0.5})
    with pytest.raises(UserInputError, match="overlong_buffer_penalty: must be >= 0"):
        reward_functions.apply_reward_shaping(batch, {**DAPO, "overlong_buffer_penalty": -1})


# --------------------------------------------------------------------------------------------- reward scaling
def test_scale_rewards_clamps_then_maps_total_and_component_rewards() -> None:
    cfg = {"enabled": True, "source_min": 0.0, "source_max": 2.0, "target_min": -1.0, "target_max": 1.0}
    batch = BatchedDataDict(
        total_reward=torch.tensor([0.0, 1.0, 2.0, 3.0]), reward1=torch.tensor([2.0, -1.0, 1.0, 0.5])
    )
    assert grpo.scale_rewards(batch, cfg) is batch
    torch.testing.assert_close(batch["total_reward"], torch.tensor([-1.0, 0.0, 1.0, 1.0]))
    torch.testing.assert_close(batch["reward1"], torch.tensor([1.0, -1.0, 0.0, -0.5]))


def test_scale_rewards_defaults_disabled_and_bad_range() -> None:
    batch = BatchedDataDict(total_reward=torch.tensor([0.5, 4.0]))
    grpo.scale_rewards(batch, {"enabled": False, "source_max": 10.0})
    assert batch["total_reward"].tolist() == [0.5, 4.0]
    grpo.scale_rewards(batch, RewardScalingConfig(enabled=True, target_max=10.0))  # source [0, 1] by default
    assert batch["total_reward"].tolist() == [5.0, 10.0]
    with pytest.raises(UserInputError, match=r"reward_scaling\.source_max: must be > source_min"):
        grpo.scale_rewards(batch, {"enabled": True, "source_min": 1.0, "source_max": 1.0})


# --------------------------------------------------------------------------------------------- dynamic sampling
def _rollouts(rewards: list[float]) -> BatchedDataDict:
    return BatchedDataDict(idx=list(range(len(rewards))), total_reward=torch.tensor(rewards))


def _loop(prompts: int, **extra: object) -> dict:
    return {"use_dynamic_sampling": True, "num_prompts_per_step": prompts, "num_generations_per_prompt": 2, **extra}


def test_dynamic_sampling_keeps_samples_with_nonzero_std_and_slices_to_the_step() -> None:
    std, baseline = torch.tensor([0.0, 0.0, 0.7, 0.7, 0.5, 0.5]), torch.tensor([1.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    batch, complete, cache, metrics = grpo.dynamic_sampling(
        _rollouts([1, 1, 0, 1, 1, 0]), std, baseline, 1, {"grpo": _loop(1)}, Timer()
    )
    assert complete and metrics == {"dynamic_sampling_num_discarded_valid_samples": 2}
    assert batch["idx"] == [2, 3] and batch["filtered_reward"].tolist() == [0.0, 1.0]
    assert batch["std"].tolist() == pytest.approx([0.7, 0.7]) and batch["baseline"].tolist() == [0.5, 0.5]
    assert cache is not None and cache["idx"] == [2, 3, 4, 5]


def test_dynamic_sampling_caches_until_enough_then_stops_at_the_limit() -> None:
    master = SimpleNamespace(
        grpo=GRPOConfig(use_dynamic_sampling=True, num_prompts_per_step=2, num_generations_per_prompt=2)
    )
    signal = torch.tensor([0.0, 0.0, 0.5, 0.5])
    first, complete, cache, _ = grpo.dynamic_sampling(
        _rollouts([1, 1, 0, 1]), signal, torch.zeros(4), 1, master, Timer()
    )
    assert not complete and first["idx"] == [2, 3] and cache is not None
    batch, complete, cache, metrics = grpo.dynamic_sampling(
        _rollouts([0, 1, 1, 1]), torch.tensor([0.5, 0.5, 0.0, 0.0]), torch.zeros(4), 2, master, Timer(), cache
    )
    assert complete and batch["idx"] == [2, 3, 0, 1] and metrics["dynamic_sampling_num_discarded_valid_samples"] == 0
    limited = {"grpo": _loop(2, dynamic_sampling_max_gen_batches=2)}
    with pytest.raises(UserInputError, match=r"grpo\.dynamic_sampling_max_gen_batches: reached"):
        grpo.dynamic_sampling(_rollouts([1, 1, 0, 1]), signal, torch.zeros(4), 3, limited, Timer())


def test_dynamic_sampling_off_returns_the_batch_whole_and_ppo_reads_its_own_section() -> None:
    std = torch.tensor([0.0, 0.0])
    batch, complete, cache, metrics = grpo.dynamic_sampling(
        _rollouts([1, 1]), std, torch.ones(2), 1, {"grpo": {"use_dynamic_sampling": False}}, Timer()
    )
    assert complete and cache is None and metrics == {} and batch["idx"] == [0, 1] and batch["std"] is std
    master = {"ppo": _loop(1, dynamic_sampling_max_gen_batches=1), "grpo": {"use_dynamic_sampling": False}}
    with pytest.raises(UserInputError, match=r"^ppo\.dynamic_sampling_max_gen_batches"):
        ppo.dynamic_sampling(_rollouts([1, 1]), std, torch.ones(2), 2, master, Timer())


# --------------------------------------------------------------------------------------------- message logs
def test_extract_initial_prompt_messages_cuts_by_token_count_not_by_role() -> None:
    log = [_message("system", 2), _message("user", 3), _message("assistant", 2), _message("assistant", 4)]
    short = [_message("user", 4), _message("assistant", 1)]
    prompts = grpo.extract_initial_prompt_messages([log, short], torch.tensor([7, 4]))
    assert [m["role"] for m in prompts[0]] == ["system", "user", "assistant"]
    assert [m["role"] for m in prompts[1]] == ["user"]


def test_add_grpo_token_loss_masks_marks_only_generated_messages() -> None:
    generated = torch.tensor([-0.5, -0.25])
    log = [_message("user", 2), _message("assistant", 3), _message("assistant", 2, generation_logprobs=generated)]
    assert grpo.add_grpo_token_loss_masks_and_generation_logprobs([log]) is None
    assert [m["token_loss_mask"].tolist() for m in log] == [[0, 0], [0, 0, 0], [1, 1]]
    assert log[1]["generation_logprobs"].dtype == torch.float32 and log[1]["generation_logprobs"].tolist() == [0, 0, 0]
    assert log[2]["generation_logprobs"] is generated


# --------------------------------------------------------------------------------------------- logprob error
def _train_data() -> BatchedDataDict:
    # row 0 agrees (error 1), row 1 is ln 3 off on both tokens (error 3), row 2 already trains nothing
    gap = math.log(3.0)
    return BatchedDataDict(
        token_mask=torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]),
        sample_mask=torch.tensor([1.0, 1.0, 0.0]),
        prev_logprobs=torch.zeros(3, 3),
        generation_logprobs=torch.tensor([[9.0, 0.0, 0.0], [0.0, gap, -gap], [0.0, 5.0, 0.0]]),
    )


def test_seq_logprob_error_masking_masks_above_threshold_and_reports_before_and_after() -> None:
    data = _train_data()
    metrics = grpo.compute_and_apply_seq_logprob_error_masking(data, torch.tensor([1.0, 1.0, 0.0]), 2.0)
    assert data["sample_mask"].tolist() == [1.0, 0.0, 0.0]
    assert metrics == pytest.approx(
        {
            "max_seq_mult_prob_error": 3.0,
            "mean_seq_mult_prob_error": 2.0,
            "min_seq_mult_prob_error": 1.0,
            "max_seq_mult_prob_error_after_mask": 1.0,
            "mean_seq_mult_prob_error_after_mask": 1.0,
            "min_seq_mult_prob_error_after_mask": 1.0,
            "num_masked_seqs": 1,
            "masked_correct_pct": 1.0,
        }
    )


def test_seq_logprob_error_without_threshold_only_measures() -> None:
    data = _train_data()
    metrics = grpo.compute_and_apply_seq_logprob_error_masking(data, torch.zeros(3), None)
    assert data["sample_mask"].tolist() == [1.0, 1.0, 0.0]
    assert metrics["max_seq_mult_prob_error_after_mask"] == pytest.approx(3.0) and metrics["num_masked_seqs"] == 0


# --------------------------------------------------------------------------------------------- metrics, names
def test_aggregate_rollout_metrics_by_name() -> None:
    aggregated = grpo.aggregate_rollout_metrics(
        {
            "turns/min": [3, 1],
            "min_len": [2, 5],
            "min_rate": [0.25, 0.75],
            "tokens/max": [1, 4],
            "max_len": [7, 2],
            "total_turns": [2, 3],
            "mean_gen_tokens": [1, 2],
            "texts": ["a", "b"],
        }
    )
    assert aggregated == {
        "turns/min": 1,
        "min_len": 2,
        "min_rate": 0.5,
        "tokens/max": 4,
        "max_len": 7,
        "total_turns": 5,
        "mean_gen_tokens": 1.5,
        "texts": ["a", "b"],
    }


def test_config_sections_and_state_are_ours() -> None:
    assert (
        grpo.RewardScalingConfig is RewardScalingConfig and reward_functions.RewardShapingConfig is RewardShapingConfig
    )
    assert grpo.AsyncGRPOConfig is AsyncGRPOConfig and grpo.AdvEstimatorConfig is AdvEstimatorConfig
    assert grpo.GRPOLoggerConfig is LoggerConfig is ppo.PPOLoggerConfig
    assert ppo.AdvEstimatorConfig is GAEConfig and ppo.PPOSaveState is RunState
    assert ppo.TokenizerType is grpo.TokenizerType and ppo.validate is run_validate


# --------------------------------------------------------------------------------------------- validation metrics
def test_validation_metrics_average_every_sample_and_count_prompts_with_a_correct_one() -> None:
    """3 prompts × 2 samples (rows prompt-major): verdicts [1 0 | 0 0 | 1 1]. By hand: accuracy (mean@2) 3/6,
    pass@2 2/3 (prompts 0 and 2), mean reward (0.5 + 0 + 0 + 0 + 1 + 1)/6, length 60 tokens / 6 samples."""
    correct = torch.tensor([True, False, False, False, True, True])
    rewards = torch.tensor([0.5, 0.0, 0.0, 0.0, 1.0, 1.0])
    got = validation_metrics(correct, rewards, 60.0, 2)
    assert got == pytest.approx({"accuracy": 0.5, "mean_reward": 2.5 / 6, "avg_length": 10.0, "pass@2": 2 / 3})
    # prompt-major, not sample-major: read as [1 0 0 | 0 1 1] by sample it would give pass@2 = 1
    assert validation_metrics(correct, rewards, 60.0, 1).keys() == {"accuracy", "mean_reward", "avg_length"}

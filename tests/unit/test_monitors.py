"""The collapse monitors on synthetic metric series: the step each one fires at, what it logs, its warning (once
per entry into the alert state), its threshold validation, and silence when disabled."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.rollout.monitor_config import MonitorsConfig
from nemo_rl_clone.rollout.monitors import CollapseMonitors, zero_variance_group_fraction
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

ALL_ALERTS = {
    f"{name}_alert" for name in ("entropy", "kl", "clip", "mismatch", "length", "zero_variance", "reward_vs_validation")
}


def run_series(
    metrics: Sequence[Mapping[str, float]],
    validations: Mapping[int, Mapping[str, float]] | None = None,
    config: Mapping[str, Any] | None = None,
) -> list[tuple[dict[str, float], list[str]]]:
    """(logged monitor metrics, warnings) of steps 1..len(metrics), the config validated as a run's would be."""
    cfg = validate_config({"monitors": dict(config or {})}, GRPOMasterConfig).monitors
    monitors = CollapseMonitors(cfg, group_size=4)
    validations = validations or {}
    return [monitors.observe(step, m, validations.get(step, {})) for step, m in enumerate(metrics, start=1)]


def alert_steps(results: list[tuple[dict[str, float], list[str]]], name: str) -> list[int]:
    return [step for step, (logged, _) in enumerate(results, start=1) if logged[f"{name}_alert"] == 1.0]


def warnings_by_step(results: list[tuple[dict[str, float], list[str]]]) -> dict[int, list[str]]:
    return {step: warnings for step, (_, warnings) in enumerate(results, start=1) if warnings}


def test_entropy_collapse_fires_below_the_fraction_of_the_early_run_value_and_warns_once_per_episode():
    series = [1.0, 0.9, 1.1, 0.8, 0.5, 0.25, 0.2, 0.5, 0.2]
    results = run_series([{"approx_entropy": e} for e in series])
    assert alert_steps(results, "entropy") == [6, 7, 9]
    # the ratio is to the mean of the first 3 steps (1.0) once that baseline is complete
    assert [r[0]["entropy_ratio"] for r in results[3:]] == pytest.approx([0.8, 0.5, 0.25, 0.2, 0.5, 0.2])
    assert results[1][0]["entropy_ratio"] == pytest.approx(0.9 / 0.95)  # the baseline so far
    # step 7 is still alerting: no second warning until the alert cleared (step 8)
    assert warnings_by_step(results) == {
        6: [
            "step 6: monitor entropy collapse: train/approx_entropy 0.25 is 0.25x its early-run value 1 (below "
            "monitors.entropy.min_ratio 0.3). The policy is becoming deterministic: raise the sampling temperature, "
            "lower the learning rate, or loosen ratio_clip_max (clip-higher)."
        ],
        9: [results[8][1][0]],
    }
    assert results[8][1][0].startswith("step 9: monitor entropy collapse: train/approx_entropy 0.2 is 0.20x")


def test_entropy_that_declines_slowly_or_is_low_from_the_start_does_not_fire():
    slow = run_series([{"approx_entropy": e} for e in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.35)])
    assert alert_steps(slow, "entropy") == []
    low_start = run_series([{"approx_entropy": e} for e in (1.0, 0.1, 0.1, 0.1, 0.1)])  # baseline 0.4: ratio 0.25
    assert alert_steps(low_start, "entropy") == [4, 5]
    assert alert_steps(run_series([{"approx_entropy": 0.05}] * 6), "entropy") == []


def test_kl_spike_needs_a_multiple_of_the_recent_median_and_the_floor():
    series = [0.01, 0.012, 0.011, 0.01, 0.2, 0.01, 0.02]
    results = run_series([{"kl_penalty": v} for v in series])
    assert alert_steps(results, "kl") == [5]
    assert results[4][0]["kl_ratio"] == pytest.approx(0.2 / 0.0105)  # median of 0.01, 0.012, 0.011, 0.01
    assert results[0][0]["kl_ratio"] == 1.0  # no history yet
    assert results[4][1] == [
        "step 5: monitor KL spike: train/kl_penalty 0.2 is 19.0x its median 0.0105 over the last 4 steps (above "
        "monitors.kl.factor 5.0 and monitors.kl.floor 0.05). The policy is leaving the reference fast: lower the "
        "learning rate, raise loss_fn.reference_policy_kl_penalty, or resume from an earlier checkpoint."
    ]
    windowed = run_series([{"kl_penalty": v} for v in (0.01, 0.01, 0.01, 0.01, 0.02, 0.03, 0.2)], config={"window": 3})
    assert alert_steps(windowed, "kl") == [7]  # median of the previous 3 steps: 0.02
    assert "0.2 is 10.0x its median 0.02 over the last 3 steps" in windowed[6][1][0]
    # 10x the median but under the floor; a spike before baseline_steps of history; a zero KL (no KL term)
    assert alert_steps(run_series([{"kl_penalty": v} for v in (0.001, 0.001, 0.001, 0.01)]), "kl") == []
    assert alert_steps(run_series([{"kl_penalty": v} for v in (0.01, 0.5, 0.01)]), "kl") == []
    zeros = run_series([{"kl_penalty": 0.0}] * 5)
    assert alert_steps(zeros, "kl") == [] and [r[0]["kl_ratio"] for r in zeros] == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_clip_jump_fires_above_its_absolute_bound_from_the_first_step():
    steady = {"probs_ratio": 1.001, "probs_ratio_clamped": 1.0}
    results = run_series([{"probs_ratio": 1.1, "probs_ratio_clamped": 1.02}, steady, steady])
    assert alert_steps(results, "clip") == [1]
    assert results[0][0]["clip"] == pytest.approx(0.08)
    assert results[0][1] == [
        "step 1: monitor clip jump: |train/probs_ratio - train/probs_ratio_clamped| 0.08 is above monitors.clip.bound "
        "0.05. Updates move the policy far within a step: lower the learning rate, or use fewer optimizer steps per "
        "rollout batch (a larger policy.train_global_batch_size)."
    ]
    assert alert_steps(run_series([steady] * 6), "clip") == []


def test_mismatch_jump_fires_on_the_excess_of_token_mult_prob_error_over_one():
    series = [1.002, 1.003, 1.002, 1.003, 1.03, 1.003, 1.2]
    results = run_series([{"token_mult_prob_error": v} for v in series])
    assert alert_steps(results, "mismatch") == [5, 7]
    assert results[4][0]["mismatch"] == pytest.approx(0.03)
    assert results[4][0]["mismatch_ratio"] == pytest.approx(0.03 / 0.0025)
    assert results[4][1][0].startswith(
        "step 5: monitor trainer/generator mismatch: train/token_mult_prob_error - 1 0.03 is 12.0x its median 0.0025"
    )
    assert results[6][1][0].startswith(
        "step 7: monitor trainer/generator mismatch: train/token_mult_prob_error - 1 0.2 is above "
        "monitors.mismatch.bound 0.05. The engines' logprobs disagree with the trainer's"
    )
    steady = run_series([{"token_mult_prob_error": 1.004}] * 8)
    assert alert_steps(steady, "mismatch") == []


def test_length_drift_and_truncation_fire():
    lengths = [100.0, 110.0, 90.0, 120.0, 20.0, 100.0, 350.0]
    results = run_series([{"rollout/mean_generation_length": v, "rollout/truncation_rate": 0.0} for v in lengths])
    assert alert_steps(results, "length") == [5, 7]
    assert [r[0]["length_ratio"] for r in results[3:]] == pytest.approx([1.2, 0.2, 1.0, 3.5])
    assert results[4][1] == [
        "step 5: monitor response length drift: mean 20.0 tokens is 0.20x its early-run value 100.0 (outside "
        "monitors.length.min_ratio 0.3). Look at the samples for a reward shortcut (empty or padded answers); "
        "consider a length-aware reward or grpo.reward_shaping."
    ]
    assert results[6][1][0].startswith("step 7: monitor response length drift: mean 350.0 tokens is 3.50x")
    assert "(outside monitors.length.max_ratio 3.0)" in results[6][1][0]
    truncated = run_series([{"rollout/mean_generation_length": 128.0, "rollout/truncation_rate": 0.75}])
    assert truncated[0][1] == [
        "step 1: monitor response length: 75% of the responses hit the token limit (above "
        "monitors.length.max_truncation_rate 0.5); their rewards judge unfinished answers: raise "
        "policy.generation.max_new_tokens, or turn on grpo.overlong_filtering or grpo.reward_shaping."
    ]
    growing = [100.0, 120.0, 150.0, 200.0, 250.0, 300.0]
    quiet = run_series([{"rollout/mean_generation_length": v, "rollout/truncation_rate": 0.4} for v in growing])
    assert alert_steps(quiet, "length") == []


def test_zero_variance_share_from_the_rewards_of_the_prompt_groups(capsys):
    signal = [0.0, 1.0, 0.0, 0.0]
    four_flat = torch.tensor([0.0] * 8 + [1.0] * 8 + signal)  # 5 groups of 4: 4 without variance
    assert zero_variance_group_fraction(four_flat, 4) == pytest.approx(0.8)
    all_flat = torch.tensor([1.0] * 8 + [0.0] * 12)
    assert zero_variance_group_fraction(all_flat, 4) == 1.0
    # judged on the mean of the last num_steps (5) steps: one flat step among signal-rich ones does not fire
    monitors = CollapseMonitors(MonitorsConfig(), group_size=4)
    series = [four_flat] * 4 + [all_flat] * 3
    logged = [monitors.update(step, {}, rewards, {}) for step, rewards in enumerate(series, start=1)]
    assert [m["zero_variance_group_fraction"] for m in logged] == pytest.approx([0.8] * 4 + [1.0] * 3)
    assert [m["zero_variance_group_fraction_mean"] for m in logged] == pytest.approx(
        [0.8, 0.8, 0.8, 0.8, 0.84, 0.88, 0.92]
    )
    # step 5's mean 0.84 is above 0.8 and five steps are seen: it fires there, once
    assert [m["zero_variance_alert"] for m in logged] == [0.0] * 4 + [1.0] * 3
    # one console line, however wide
    assert capsys.readouterr().out.splitlines() == [
        "step 5: monitor zero-variance groups: over the last 5 steps 84% of the prompt groups had all-equal rewards "
        "(above monitors.zero_variance.max_fraction 0.8); GRPO learns nothing from them. Use data of a difficulty "
        "the model sometimes solves, raise grpo.num_generations_per_prompt, or turn on grpo.use_dynamic_sampling."
    ]
    # a flapping share (the main job's first steps: 0.62, 0.5, 0.88, 0.62, 0.75, 0.75) stays quiet
    flapping = CollapseMonitors(MonitorsConfig(), group_size=4)
    means = [
        flapping.observe(s, {"zero_variance_group_fraction": f}, {})[0]
        for s, f in enumerate([0.62, 0.5, 0.88, 0.62, 0.75, 0.75, 0.88], start=1)
    ]
    assert [m["zero_variance_alert"] for m in means] == [0.0] * 7


def test_reward_rising_while_validation_falls_over_the_last_validations():
    rewards = [{"reward": 0.1 * step} for step in range(1, 7)]
    falling = {2: {"accuracy": 0.5}, 4: {"accuracy": 0.48}, 6: {"accuracy": 0.45}}
    results = run_series(rewards, falling)
    assert alert_steps(results, "reward_vs_validation") == [6]
    assert results[5][0]["reward_trend"] == pytest.approx(0.55 - 0.15)  # mean of steps 5-6 minus mean of steps 1-2
    assert results[5][0]["validation_trend"] == pytest.approx(-0.05)
    assert results[3][0]["validation_trend"] == pytest.approx(-0.02)  # two validations so far: no alert yet
    assert results[5][1] == [
        "step 6: monitor reward up, validation down: over the last 3 validations the training reward rose by 0.4 "
        "while validation/accuracy fell by 0.05 (more than monitors.reward_vs_validation.min_drop 0.02). The "
        "policy may be exploiting the reward or overfitting the training prompts: read the samples, check the "
        "verifier, and compare with an earlier checkpoint."
    ]
    flat = {2: {"accuracy": 0.5}, 4: {"accuracy": 0.49}, 6: {"accuracy": 0.49}}
    assert alert_steps(run_series(rewards, flat), "reward_vs_validation") == []
    falling_reward = [{"reward": 1 - 0.1 * step} for step in range(1, 7)]
    assert alert_steps(run_series(falling_reward, falling), "reward_vs_validation") == []


def test_every_monitor_logs_its_alert_every_step_and_disabled_monitors_log_nothing():
    step = {
        "approx_entropy": 0.5,
        "kl_penalty": 0.0,
        "probs_ratio": 1.0,
        "probs_ratio_clamped": 1.0,
        "token_mult_prob_error": 1.001,
        "rollout/mean_generation_length": 40.0,
        "rollout/truncation_rate": 0.1,
        "reward": 0.3,
        "zero_variance_group_fraction": 0.25,
    }
    logged, warnings = run_series([step])[0]
    assert set(logged) == ALL_ALERTS | {
        "entropy_ratio",
        "kl_ratio",
        "clip",
        "clip_ratio",
        "mismatch",
        "mismatch_ratio",
        "length_ratio",
        "zero_variance_group_fraction",
        "zero_variance_group_fraction_mean",
        "reward_trend",
        "validation_trend",
    }
    assert warnings == [] and not any(logged[key] for key in ALL_ALERTS)
    # a step that lacks a monitor's input metric still logs that monitor's alert
    assert set(run_series([{}])[0][0]) == ALL_ALERTS | {"reward_trend", "validation_trend"}
    assert run_series([step], config={"enabled": False}) == [({}, [])]
    assert CollapseMonitors(MonitorsConfig(enabled=False), 4).update(1, step, torch.zeros(8), {}) == {}
    only_kl_off = run_series([step], config={"kl": {"enabled": False}})[0][0]
    assert "kl_alert" not in only_kl_off and "kl_ratio" not in only_kl_off and "entropy_alert" in only_kl_off


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            {"baseline_steps": 0, "window": 0},
            ["monitors.baseline_steps: must be >= 1, got 0", "monitors.window: must be >= 1, got 0"],
        ),
        (
            {"entropy": {"min_ratio": 1.5}},
            ["monitors.entropy.min_ratio: must be in (0, 1): a fraction of the early-run entropy, got 1.5"],
        ),
        (
            {"kl": {"factor": 1, "floor": -1}},
            [
                "monitors.kl.factor: must be > 1: a multiple of the recent median, got 1.0",
                "monitors.kl.floor: must be >= 0, got -1.0",
            ],
        ),
        ({"clip": {"bound": 0.001}}, ["monitors.clip.bound: must be > floor (0.001 <= 0.005), or null for no bound"]),
        (
            {"length": {"min_ratio": 0, "max_ratio": 0.5, "max_truncation_rate": 1}},
            [
                "monitors.length.min_ratio: must be in (0, 1), got 0.0",
                "monitors.length.max_ratio: must be > 1, got 0.5",
                "monitors.length.max_truncation_rate: must be in (0, 1), got 1.0",
            ],
        ),
        (
            {"zero_variance": {"max_fraction": 1}},
            ["monitors.zero_variance.max_fraction: must be in (0, 1) (set enabled: false to turn it off), got 1.0"],
        ),
        (
            {"reward_vs_validation": {"num_validations": 1, "min_drop": -0.1}},
            [
                "monitors.reward_vs_validation.num_validations: must be >= 2 (a trend needs two points), got 1",
                "monitors.reward_vs_validation.min_drop: must be >= 0, got -0.1",
            ],
        ),
    ],
)
def test_threshold_validation_errors(section, expected):
    with pytest.raises(ConfigError) as err:
        validate_config({"monitors": section}, GRPOMasterConfig)
    assert err.value.problems == expected


def test_a_partial_section_keeps_the_other_defaults_of_that_monitor():
    monitors = validate_config({"monitors": {"clip": {"factor": 3}, "mismatch": {"bound": 0.1}}}, GRPOMasterConfig)
    clip, mismatch = monitors.monitors.clip, monitors.monitors.mismatch
    assert (clip.factor, clip.floor, clip.bound) == (3.0, 0.005, 0.05)
    assert (mismatch.factor, mismatch.floor, mismatch.bound) == (5.0, 0.01, 0.1)


def test_unknown_monitor_key_is_refused():
    with pytest.raises(ConfigError) as err:
        validate_config({"monitors": {"entropy": {"min_ration": 0.2}}}, GRPOMasterConfig)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith("monitors.entropy.min_ration: unknown key")


def test_a_resumed_run_continues_the_monitors_history_from_its_checkpoint():
    """The monitors' state goes through training_info.json (`RunState.monitors`): resumed after step 5, a run warns
    and logs exactly as an uninterrupted one."""
    series = [
        {
            "approx_entropy": entropy,
            "kl_penalty": kl,
            "token_mult_prob_error": 1.002,
            "rollout/mean_generation_length": 100.0,
            "reward": 0.1 * step,
            "zero_variance_group_fraction": 0.95 if step >= 3 else 0.5,
        }
        for step, (entropy, kl) in enumerate(
            zip([1.0] * 4 + [0.5, 0.2, 0.2, 0.9, 0.1], [0.01] * 7 + [0.3, 0.01], strict=True), 1
        )
    ]
    validations = {3: {"accuracy": 0.5}, 6: {"accuracy": 0.47}, 9: {"accuracy": 0.4}}
    cfg = MonitorsConfig()
    straight = CollapseMonitors(cfg, 4)
    expected = [straight.observe(step, m, validations.get(step, {})) for step, m in enumerate(series, start=1)]
    first = CollapseMonitors(cfg, 4)
    resumed_results = [first.observe(step, series[step - 1], validations.get(step, {})) for step in range(1, 6)]
    state = RunState(step=5, monitors=first.state_dict())
    restored = RunState.from_training_info(json.loads(json.dumps(state.training_info())))
    resumed = CollapseMonitors(cfg, 4, restored.monitors)
    resumed_results += [resumed.observe(step, series[step - 1], validations.get(step, {})) for step in range(6, 10)]
    assert resumed_results == expected
    # the uninterrupted run fired entropy (6, 9), KL (8), zero variance (6: the 5-step mean crosses 0.8 there, from a
    # history that spans the resume) and reward-vs-validation (9): after the resume none is repeated or lost
    assert warnings_by_step(expected).keys() == {6, 8, 9}
    assert [w.split(": ")[1] for w in expected[5][1]] == ["monitor entropy collapse", "monitor zero-variance groups"]
    assert [w.split(": ")[1] for w in expected[8][1]] == [
        "monitor entropy collapse",
        "monitor reward up, validation down",
    ]

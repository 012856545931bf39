"""MathEnvironment as a real Ray actor with real math-verify: scoring, failure isolation and restarts."""

from __future__ import annotations

from typing import Any

import pytest
import ray
import torch

from nemo_rl_clone.environments import create_env
from nemo_rl_clone.environments.config import MathEnvConfig
from nemo_rl_clone.environments.interfaces import EnvironmentReturn

# Outer deadline 6 s, math-verify's own per-call timeout 2 s: generous for a loaded 2-core machine, short enough
# for the pathological-input test.
TEST_CFG = MathEnvConfig(num_workers=2, verifier_timeout_s=6.0)
PATHOLOGICAL = "so the answer is \\boxed{9^{9^{9^{9}}}}"  # sympy would compute a ~10^8-digit power


def conversation(*assistant_turns: str) -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = [{"role": "user", "content": "Solve it.", "token_ids": torch.tensor([1, 2])}]
    for index, turn in enumerate(assistant_turns):
        if index:
            log.append({"role": "environment", "content": "Environment: incorrect", "token_ids": torch.tensor([3])})
        log.append({"role": "assistant", "content": turn, "token_ids": torch.tensor([4, 5])})
    return log


def step(env: Any, responses: list[str], ground_truths: list[Any]) -> EnvironmentReturn:
    logs = [conversation(response) for response in responses]
    return ray.get(env.step.remote(logs, [{"ground_truth": truth} for truth in ground_truths]))


def reset_metrics(env: Any) -> None:
    ray.get(env.global_post_process_and_metrics.remote({"rewards": torch.zeros(1)}))


@pytest.fixture(scope="module")
def math_env(ray_local: None):
    env = create_env("math", TEST_CFG)
    yield env
    ray.get(env.shutdown.remote())
    ray.kill(env)


def test_rewards_observations_and_answers(math_env: Any) -> None:
    result = step(
        math_env,
        [
            "Half of one is \\boxed{\\frac{1}{2}}.",  # LaTeX vs decimal gold
            "The answer is 42.",  # unboxed: math-verify takes the last expression
            "So \\boxed{41}.",
            "I don't know.",
            "12",
            "$x = 3/4$",
            "\\boxed{5}",
        ],
        ["0.5", "42", "42", "7", 12, "\\frac{3}{4}", "$5$"],  # gold as plain text, number, LaTeX or $-math
    )
    assert isinstance(result, EnvironmentReturn)
    assert result.rewards.dtype == torch.float32
    assert result.rewards.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert result.terminateds.dtype == torch.bool and result.terminateds.tolist() == [True] * 7
    assert result.answers[:4] == ["\\frac{1}{2}", "42", "41", None]
    assert [observation["role"] for observation in result.observations] == ["environment"] * 7
    assert [observation["content"] for observation in result.observations][:3] == [
        "Environment: correct",
        "Environment: correct",
        "Environment: incorrect",
    ]
    assert result.next_stop_strings == [None] * 7
    assert result.metadata[4] == {"ground_truth": 12}


def test_only_the_last_assistant_turn_is_scored(math_env: Any) -> None:
    logs = [conversation("\\boxed{5}", "\\boxed{6}")] * 2
    result = ray.get(math_env.step.remote(logs, [{"ground_truth": "5"}, {"ground_truth": "6"}]))
    assert result.rewards.tolist() == [0.0, 1.0]


def test_a_pathological_answer_times_out_scores_zero_and_the_batch_goes_on(math_env: Any) -> None:
    reset_metrics(math_env)
    result = step(math_env, [PATHOLOGICAL, "\\boxed{3}", "\\boxed{4}"], ["42", "3", "4"])
    assert result.rewards.tolist() == [0.0, 1.0, 1.0]
    _, metrics = ray.get(math_env.global_post_process_and_metrics.remote({"rewards": result.rewards}))
    assert metrics["verifier_timeouts"] == 1.0
    assert metrics["verifier_errors"] == 0.0
    # The environment still works afterwards.
    assert step(math_env, ["\\boxed{8}"], ["8"]).rewards.tolist() == [1.0]


def test_a_raising_verifier_scores_zero_and_the_batch_goes_on(math_env: Any) -> None:
    # A gold answer math-verify cannot parse makes the verifier raise ValueError.
    reset_metrics(math_env)
    result = step(math_env, ["\\boxed{1}", "\\boxed{2}"], ["}{", "2"])
    assert result.rewards.tolist() == [0.0, 1.0]
    _, metrics = ray.get(math_env.global_post_process_and_metrics.remote({"rewards": result.rewards}))
    assert metrics["verifier_errors"] == 1.0
    assert metrics["verifier_timeouts"] == 0.0


def test_a_killed_verifier_is_replaced_and_the_next_step_scores_correctly(math_env: Any) -> None:
    reset_metrics(math_env)
    workers = ray.get(math_env.verifier_workers.remote())
    ray.kill(workers[0])
    result = step(math_env, ["\\boxed{1}", "\\boxed{0}", "\\boxed{2}", "\\boxed{3}"], ["1", "1", "2", "3"])
    assert result.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]
    _, metrics = ray.get(math_env.global_post_process_and_metrics.remote({"rewards": result.rewards}))
    assert metrics["verifier_restarts"] == 1.0
    assert metrics["verifier_crashes"] == 0.0  # the lost response was retried on the new verifier
    assert ray.get(math_env.verifier_workers.remote())[0] != workers[0]


def test_the_environment_actor_restarts_after_it_dies(math_env: Any) -> None:
    workers_before = ray.get(math_env.verifier_workers.remote())
    ray.kill(math_env, no_restart=False)
    result = step(math_env, ["\\boxed{10}", "\\boxed{11}"], ["10", "10"])  # retried on the restarted actor
    assert result.rewards.tolist() == [1.0, 0.0]
    # The restarted actor ran its constructor again: a fresh verifier pool.
    workers_after = ray.get(math_env.verifier_workers.remote())
    assert len(workers_after) == 2 and not set(workers_before) & set(workers_after)


def test_metrics_of_a_rolled_out_batch(math_env: Any) -> None:
    reset_metrics(math_env)
    result = step(math_env, ["\\boxed{1}", "no answer", "\\boxed{5}", "\\boxed{2}"], ["1", "2", "3", "2"])
    batch = {
        "rewards": result.rewards,
        "is_end": torch.tensor([True, False, True, True]),
        "generation_lengths": torch.tensor([10, 40, 20, 30]),
    }
    returned, metrics = ray.get(math_env.global_post_process_and_metrics.remote(batch))
    assert torch.equal(returned["rewards"], result.rewards)  # rewards are reported, not changed
    assert metrics == {
        "accuracy": 0.5,
        "mean_reward": 0.5,
        "num_samples": 4.0,
        "fraction_of_samples_properly_ended": 0.75,
        "generation_lengths": 25.0,
        "correct_solution_generation_lengths": 20.0,
        "fraction_answer_extracted": 0.75,
        "verifier_timeouts": 0.0,
        "verifier_errors": 0.0,
        "verifier_crashes": 0.0,
        "verifier_restarts": 0.0,
    }


@pytest.mark.parametrize(
    ("logs", "metadata", "error", "message"),
    [
        ([conversation("1")], [], ValueError, "step got 1 message logs but 0 metadata dicts"),
        (
            [conversation("1")],
            [{"answer": "1"}],
            ValueError,
            r"sample 0: math environment metadata needs 'ground_truth'",
        ),
        ([conversation("1")], [{"ground_truth": ["1"]}], TypeError, "sample 0: 'ground_truth' must be a str"),
        (
            [[{"role": "user", "content": "hi"}]],
            [{"ground_truth": "1"}],
            ValueError,
            "sample 0: message_log has no "
            r"assistant message to score \(roles: \['user'\]\)",
        ),
    ],
)
def test_bad_step_inputs_raise_clear_errors(
    math_env: Any, logs: list, metadata: list, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        ray.get(math_env.step.remote(logs, metadata))


def test_last_number_extraction_scores_only_the_last_number(ray_local: None) -> None:
    response = "First I guessed \\boxed{3}, but the result is 4"
    env = create_env("math", MathEnvConfig(num_workers=1, answer_extraction="last_number", verifier_timeout_s=6.0))
    try:
        result = step(env, [response, "no number here"], ["4", "4"])
        assert result.rewards.tolist() == [1.0, 0.0]
        assert result.answers == ["4", None]
    finally:
        ray.kill(env)


def test_create_env_rejects_bad_names_and_configs(ray_local: None) -> None:
    with pytest.raises(
        ValueError,
        match="unknown environment 'maths'; registered: agent, code, code_jaccard, math, math_multi_reward, reasoning_gym, reward_model, sliding",
    ):
        create_env("maths", TEST_CFG)
    with pytest.raises(
        ValueError,
        match=r"invalid env\.math config: answer_extraction: unknown method 'lastnum'; valid: "
        "math_verify, boxed, answer_tag, last_number, auto; num_workers: must be >= 1, got 0",
    ):
        create_env("math", MathEnvConfig(num_workers=0, answer_extraction="lastnum"))  # type: ignore[arg-type]

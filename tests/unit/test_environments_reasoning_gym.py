"""ReasoningGymEnvironment as a real Ray actor with real reasoning-gym datasets and scorers."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import ray
import reasoning_gym
import torch

from nemo_rl_clone.environments import create_env
from nemo_rl_clone.environments.config import ReasoningGymEnvConfig
from nemo_rl_clone.environments.interfaces import EnvironmentReturn
from nemo_rl_clone.environments.reasoning_gym_environment import resolve_task

CHAIN_SUM_KWARGS = {"min_terms": 2, "max_terms": 2, "max_digits": 1, "seed": 7, "size": 20}


def sample(task: str, entry: dict[str, Any], response: str, task_kwargs: dict | None = None) -> tuple[list, dict]:
    log = [
        {"role": "user", "content": entry["question"], "token_ids": torch.tensor([1, 2, 3])},
        {"role": "assistant", "content": response, "token_ids": torch.tensor([4, 5])},
    ]
    metadata: dict[str, Any] = {"task": task, "entry": entry}
    if task_kwargs is not None:
        metadata["task_kwargs"] = task_kwargs
    return log, metadata


def step(env: Any, samples: list[tuple[list, dict]]) -> EnvironmentReturn:
    return ray.get(env.step.remote([log for log, _ in samples], [metadata for _, metadata in samples]))


@pytest.fixture(scope="module")
def rg_env(ray_local: None):
    env = create_env("reasoning_gym", ReasoningGymEnvConfig(num_workers=2, verifier_timeout_s=5.0))
    yield env
    ray.get(env.shutdown.remote())
    ray.kill(env)


@pytest.fixture(scope="module")
def chain_sum_entries() -> list[dict[str, Any]]:
    entries = list(reasoning_gym.create_dataset("chain_sum", **CHAIN_SUM_KWARGS))
    # Seeded generation: the same kwargs give the same problems.
    assert entries == list(reasoning_gym.create_dataset("chain_sum", **CHAIN_SUM_KWARGS))
    return [entry for entry in entries if not entry["answer"].startswith("-")][:2]


def test_chain_sum_scoring_with_auto_extraction(rg_env: Any, chain_sum_entries: list[dict[str, Any]]) -> None:
    first, second = chain_sum_entries
    answer, other = first["answer"], second["answer"]
    result = step(
        rg_env,
        [
            sample("chain_sum", first, f"Let me think. <answer>{answer}</answer>"),
            sample("chain_sum", first, f"Adding them up, the result is {answer}."),  # last-number fallback
            sample("chain_sum", first, f"I think it is 1{answer}"),  # oracle inside a longer number: partial credit
            sample("chain_sum", first, f"\\boxed{{{int(answer) + 1}}}"),
            sample("chain_sum", second, "I cannot tell."),
            sample("chain_sum", second, f"<answer>{other}</answer> (not {int(other) + 3})"),  # the tag beats 2nd number
        ],
    )
    expected_partial = len(answer) / (len(answer) + 1)  # reasoning-gym: len(oracle) / len(answer)
    assert result.rewards.tolist() == pytest.approx([1.0, 1.0, expected_partial, 0.0, 0.0, 1.0], abs=1e-6)
    assert result.answers == [answer, answer, f"1{answer}", str(int(answer) + 1), None, other]
    assert result.terminateds.tolist() == [True] * 6
    assert result.observations[2]["content"] == f"Environment: partially correct (score {expected_partial:.2f})"
    assert result.observations[3]["content"] == "Environment: incorrect"


def test_a_text_task_scores_its_tagged_answer(rg_env: Any) -> None:
    entry = reasoning_gym.create_dataset("word_sorting", seed=3, size=1)[0]
    result = step(
        rg_env,
        [
            sample("word_sorting", entry, f"<answer>{entry['answer']}</answer>"),
            sample("word_sorting", entry, "<answer>zebra, apple</answer>"),
        ],
    )
    assert result.rewards.tolist() == [1.0, 0.0]


def test_task_kwargs_reach_config_dependent_scorers(rg_env: Any) -> None:
    # puzzle24's scorer rejects numbers outside the dataset's [min_value, max_value] (0.01 is its score for a
    # wrong answer); 4*3*2*1 = 24 is valid under the defaults (1..10) but not for a dataset built with min_value=5.
    task_kwargs = {"min_value": 5, "max_value": 10, "seed": 1, "size": 4}
    entry = reasoning_gym.create_dataset("puzzle24", **task_kwargs)[0]
    result = step(
        rg_env,
        [
            sample("puzzle24", entry, "<answer>4*3*2*1</answer>"),
            sample("puzzle24", entry, "<answer>4*3*2*1</answer>", task_kwargs),
        ],
    )
    assert result.rewards.tolist() == pytest.approx([1.0, 0.01])


def test_a_hanging_scorer_is_cut_off_and_scores_zero(rg_env: Any, chain_sum_entries: list[dict[str, Any]]) -> None:
    # n_queens' scorer eval()s the answer; this power runs for minutes inside C code, out of a signal's reach.
    entry = reasoning_gym.create_dataset("n_queens", seed=2, size=1)[0]
    ray.get(rg_env.global_post_process_and_metrics.remote({"rewards": torch.zeros(1)}))  # reset the counters
    result = step(
        rg_env,
        [
            sample("n_queens", entry, "<answer>9**9**9**9</answer>"),
            sample("chain_sum", chain_sum_entries[0], chain_sum_entries[0]["answer"]),
        ],
    )
    assert result.rewards.tolist() == [0.0, 1.0]
    _, metrics = ray.get(rg_env.global_post_process_and_metrics.remote({"rewards": result.rewards}))
    assert metrics["verifier_timeouts"] == 1.0 and metrics["verifier_restarts"] == 1.0
    assert metrics["accuracy"] == 0.5


def test_unknown_task_names_close_matches() -> None:
    with pytest.raises(ValueError, match=r"unknown reasoning-gym task 'chain_sun' \(close matches: chain_sum"):
        resolve_task("chain_sun")
    with pytest.raises(
        ValueError,
        match=r"unknown reasoning-gym task 'zzzzzz' \(no close match\); reasoning-gym "
        r"registers \d+ tasks",
    ):
        resolve_task("zzzzzz")
    assert resolve_task("gcd") == "gcd"


@pytest.mark.parametrize(
    ("metadata", "error", "message"),
    [
        (
            {"task": "chain_sun", "entry": {"answer": "1"}},
            ValueError,
            r"sample 0: unknown reasoning-gym task "
            r"'chain_sun' \(close matches: chain_sum",
        ),
        ({"entry": {"answer": "1"}}, ValueError, r"sample 0: reasoning-gym metadata needs \['task'\]"),
        ({"task": "chain_sum", "entry": "1"}, ValueError, "sample 0: 'entry' must be a reasoning-gym entry dict"),
        (
            {"task": "chain_sum", "entry": {"answer": "1"}, "task_kwargs": {"max_term": 3}},
            ValueError,
            r"sample 0: reasoning-gym task 'chain_sum' rejects task_kwargs \{'max_term': 3\}: .*max_term",
        ),
        (
            {"task": "chain_sum", "entry": {"answer": "1"}, "task_kwargs": [3]},
            TypeError,
            "sample 0: 'task_kwargs' must be a dict, got list",
        ),
    ],
)
def test_bad_metadata_raises_clear_errors(rg_env: Any, metadata: dict, error: type, message: str) -> None:
    log = [{"role": "assistant", "content": "1", "token_ids": torch.tensor([1])}]
    with pytest.raises(error, match=message):
        ray.get(rg_env.step.remote([log], [metadata]))


def test_bad_config_is_rejected_before_starting_an_actor() -> None:
    with pytest.raises(
        ValueError,
        match=r"invalid env\.reasoning_gym config: answer_extraction: unknown method "
        "'math_verify'; valid: boxed, answer_tag, last_number, auto; verifier_timeout_s: must be > 0",
    ):
        bad = ReasoningGymEnvConfig(answer_extraction="math_verify", verifier_timeout_s=0)  # type: ignore[arg-type]
        create_env("reasoning_gym", bad)


def test_a_scorer_pays_its_imports_before_the_first_deadline() -> None:
    # The pool's per-response deadline starts at the first score call; importing reasoning-gym there (seconds on a
    # loaded machine) once timed correct answers out to 0. Constructing a scorer must leave nothing to import.
    code = (
        "import sys\n"
        "from nemo_rl_clone.environments.reasoning_gym_environment import ReasoningGymScorer\n"
        "assert 'reasoning_gym' not in sys.modules\n"
        "ReasoningGymScorer('auto')\n"
        "print(sorted(name for name in ('reasoning_gym', 'reasoning_gym.arithmetic') if name in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['reasoning_gym', 'reasoning_gym.arithmetic']"

"""NeMo-RL v0.7.0's code-Jaccard environment (``env.code_jaccard``): its score on hand-computed cases, its worker's
batch form, and the environment as a Ray actor built from NeMo-RL's dict config and from a validated YAML config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import ray
import torch

from nemo_rl_clone.environments import create_env
from nemo_rl_clone.environments.code_jaccard_environment import (
    CodeJaccardEnvironment,
    CodeJaccardVerifyWorker,
    jaccard_score,
)
from nemo_rl_clone.environments.config import CodeJaccardEnvConfig, EnvConfig
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

# (response, reference, score by hand): Jaccard index of the word sets x (shorter length / longer length).
HAND_COMPUTED = [
    ("  Return X ", "return x", 1.0),  # equal once stripped and lower-cased
    ("a b c", "a b d", 2 / 4 * 5 / 5),  # {a, b} of {a, b, c, d}; both 5 characters
    ("a b", "a b c d", 2 / 4 * 3 / 7),  # the shorter response is penalised
    ("a a a b", "a b", 1.0 * 3 / 7),  # the same word set, but more than twice as long
    ("def f(): pass", "", 0.0),  # an empty reference scores 0
    ("x y", "z", 0.0),  # nothing in common
    ("def f(x):\n    return x+1", "def f(x): return x + 1", 3 / 7 * 22 / 24),
]


@pytest.mark.parametrize(("response", "reference", "expected"), HAND_COMPUTED)
def test_jaccard_score_equals_the_hand_computed_value(response: str, reference: str, expected: float) -> None:
    assert jaccard_score(response, reference) == pytest.approx(expected, abs=1e-12)


def test_the_hand_computed_cases_catch_a_score_without_the_length_penalty() -> None:
    def plain_jaccard(response: str, reference: str) -> float:
        words, reference_words = set(response.lower().split()), set(reference.lower().split())
        return len(words & reference_words) / len(words | reference_words) if reference_words else 0.0

    wrong = [(r, g) for r, g, expected in HAND_COMPUTED if plain_jaccard(r, g) != pytest.approx(expected, abs=1e-12)]
    assert len(wrong) >= 3


def test_the_worker_batch_form_returns_scores_and_optionally_the_stripped_responses() -> None:
    worker = CodeJaccardVerifyWorker()
    assert worker.verify(["a b c", "q"], ["a b d", "q"]) == pytest.approx([0.5, 1.0])
    scores, answers = worker.verify([" a b c \n"], ["a b d"], return_extracted_answer=True)
    assert scores == pytest.approx([0.5 * 5 / 5]) and answers == ["a b c"]


@dataclass
class Sections:
    """A config with an ``env`` section, as every rollout algorithm's master config has."""

    env: EnvConfig = field(default_factory=EnvConfig)


def conversation(*assistant_turns: str) -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = [{"role": "user", "content": "Write f."}]
    for turn in assistant_turns:
        log += [{"role": "assistant", "content": turn}, {"role": "environment", "content": "go on"}]
    return log[:-1]


def test_the_actor_from_nemo_rl_dict_config_scores_joined_assistant_turns(ray_local: None) -> None:
    env = CodeJaccardEnvironment.remote({"num_workers": 1, "stop_strings": None})
    try:
        logs = [conversation("a b", " c"), conversation("a b"), conversation("zzz")]
        metadata = [{"ground_truth": "a b c"}, {"ground_truth": "a b c d"}, {"ground_truth": "a b c"}]
        result = ray.get(env.step.remote(logs, metadata))
        expected = [1.0, 2 / 4 * 3 / 7, 0.0]  # turn 1: "a b" + " c" joined is the reference itself
        assert result.rewards.tolist() == pytest.approx(expected)
        assert result.rewards.dtype == torch.float32 and result.terminateds.tolist() == [True, True, True]
        assert [o["content"] for o in result.observations] == [
            "Environment: jaccard aligned (score: 1.00)",
            "Environment: jaccard misaligned (score: 0.21)",
            "Environment: jaccard misaligned (score: 0.00)",
        ]
        assert result.next_stop_strings == [None] * 3 and result.metadata == metadata
        assert result.answers == ["a b c", "a b", "zzz"]
        _, metrics = ray.get(env.global_post_process_and_metrics.remote({"rewards": torch.tensor([1.0, 0.6, 0.2])}))
        assert metrics["preference_alignment_rate"] == pytest.approx(2 / 3)
        assert metrics["average_preference_score"] == pytest.approx(0.6)
        assert metrics["high_alignment_rate"] == pytest.approx(1 / 3)
    finally:
        ray.get(env.shutdown.remote())
        ray.kill(env)


def test_env_code_jaccard_from_yaml_starts_the_environment(ray_local: None) -> None:
    section = validate_config({"env": {"code_jaccard": {"num_workers": 1, "stop_strings": None}}}, Sections).env
    assert section["code_jaccard"] == CodeJaccardEnvConfig(num_workers=1)
    env = create_env("code_jaccard", section["code_jaccard"])
    try:
        result = ray.get(env.step.remote([conversation("a b c")], [{"ground_truth": "a b d"}]))
        assert result.rewards.tolist() == pytest.approx([0.5])
    finally:
        ray.get(env.shutdown.remote())
        ray.kill(env)


def test_a_bad_section_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"env\.code_jaccard\.num_workers: must be >= 1, got 0"):
        validate_config({"env": {"code_jaccard": {"num_workers": 0}}}, Sections)

"""Evaluation metrics (pass@k, cons@k), the run summary and the eval config checks: pure functions, no Ray."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations
from pathlib import Path

import pytest

from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.evals.eval import (
    cons_at_k,
    majority_vote,
    pass_at_k,
    sample_seeds,
    score_problems,
    summarize,
)
from nemo_rl_clone.utils.config import load_validated_config
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "evals" / "eval_smoke.yaml"


# ---------------------------------------------------------------------------- pass@k
@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 0, 1, Fraction(0)),
        (5, 0, 5, Fraction(0)),  # no correct sample: 0 even when every sample is drawn
        (5, 5, 1, Fraction(1)),
        (5, 5, 5, Fraction(1)),
        (5, 2, 1, Fraction(2, 5)),  # 1 - C(3,1)/C(5,1) = 1 - 3/5
        (5, 2, 2, Fraction(7, 10)),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 3, Fraction(9, 10)),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 4, Fraction(1)),  # n - c = 3 < k: every draw of 4 holds a correct one
        (1, 1, 1, Fraction(1)),
        (1, 0, 1, Fraction(0)),
        (16, 1, 8, Fraction(1, 2)),  # a single correct sample is in half of all 8-subsets
    ],
)
def test_pass_at_k_hand_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == float(expected)  # exact: rational arithmetic, one rounding


def test_pass_at_k_equals_counting_subsets():
    """Independent reference: the fraction of k-subsets of the n samples that contain a correct one."""
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(combinations(samples, k))
                expected = Fraction(sum(any(s) for s in subsets), len(subsets))
                assert pass_at_k(n, c, k) == float(expected), (n, c, k)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match=f"n={n}, c={c}, k={k}"):
        pass_at_k(n, c, k)


# ---------------------------------------------------------------------------- cons@k
def test_majority_vote_counts_and_abstentions():
    assert majority_vote(["7", "3", "7", None]) == 0
    assert majority_vote(["3", " 7", "7 ", "3", "7"]) == 1  # whitespace around an answer does not split votes
    assert majority_vote([None, "", "  "]) is None  # no answer extracted: nobody votes
    assert majority_vote([None, "4"]) == 1


def test_majority_vote_tie_goes_to_the_answer_seen_first():
    assert majority_vote(["a", "b", "b", "a"]) == 0
    assert majority_vote([None, "b", "a", "a", "b"]) == 1
    assert majority_vote(["x", "y", "z"]) == 0


def test_cons_at_k_uses_the_first_k_samples():
    answers = ["5", "4", "4", "5", "5"]
    correct = [True, False, False, True, True]
    assert cons_at_k(answers, correct, k=1) == 1.0  # "5" alone
    assert cons_at_k(answers, correct, k=3) == 0.0  # "4" wins 2:1
    assert cons_at_k(answers, correct, k=4) == 1.0  # 2:2 tie -> "5", seen first
    assert cons_at_k(answers, correct, k=5) == 1.0  # "5" wins 3:2


def test_cons_at_k_tie_with_a_wrong_first_answer_and_no_votes():
    assert cons_at_k(["9", "6"], [False, True], k=2) == 0.0  # tie: "9" came first, and it is wrong
    assert cons_at_k([None, None], [False, False], k=2) == 0.0
    # A correct sample whose answer was not extracted does not vote.
    assert cons_at_k([None, "6"], [True, False], k=2) == 0.0


def test_cons_at_k_checks_its_inputs():
    with pytest.raises(ValueError, match="1 <= k <= number of samples"):
        cons_at_k(["1"], [True], k=2)
    with pytest.raises(ValueError, match="2 answers but 1 correctness flags"):
        cons_at_k(["1", "2"], [True], k=1)


# ---------------------------------------------------------------------------- grouping and summary
def test_score_problems_groups_consecutive_samples():
    correct = [True, False, False, False, False, False, True, True, True]
    answers = ["1", "2", "2", "0", "0", "0", "3", "3", "3"]
    assert score_problems("pass@k", correct, answers, 3, 1) == [1 / 3, 0.0, 1.0]
    assert score_problems("pass@k", correct, answers, 3, 2) == [float(Fraction(2, 3)), 0.0, 1.0]
    assert score_problems("cons@k", correct, answers, 3, 3) == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="do not form groups of 4"):
        score_problems("pass@k", correct, answers, 4, 1)


def test_summarize_reports_the_metric_over_problems():
    config = validate_config({"eval": {"num_tests_per_prompt": 2, "k_value": 1, "metric": "pass@k"}}, EvalMasterConfig)
    rows = [
        _row(reward=1.0, answer="5", tokens=10),
        _row(reward=0.0, answer="4", tokens=20, truncated=True),
        _row(reward=0.5, answer="4", tokens=30),  # partial credit is not correct
        _row(reward=0.0, answer=None, tokens=40),
    ]
    summary = summarize(config, rows, "m")
    assert summary["metric"] == "pass@1"
    assert summary["score"] == 0.25  # problem 0: 1/2, problem 1: 0
    assert summary["num_problems"] == 2 and summary["num_samples"] == 4
    assert summary["accuracy"] == 0.25
    assert summary["mean_reward"] == 0.375
    assert summary["avg_length"] == 25.0
    assert summary["truncation_rate"] == 0.25
    assert summary["answer_extracted_rate"] == 0.75
    assert summary["num_truncated_prompts"] == 0


def _row(reward: float, answer: str | None, tokens: int, truncated: bool = False) -> dict:
    return {
        "reward": reward,
        "correct": reward >= 1.0,
        "extracted_answer": answer,
        "response_tokens": tokens,
        "truncated": truncated,
    }


def test_sample_seeds_do_not_depend_on_batching():
    whole = sample_seeds(42, range(5), 3)
    batched = sample_seeds(42, [0, 1], 3) + sample_seeds(42, [2, 3, 4], 3)
    assert whole == batched
    assert len(set(whole)) == 15
    assert set(whole).isdisjoint(sample_seeds(43, range(5), 3))


# ---------------------------------------------------------------------------- config checks
def problems_of(*overrides: str) -> list[str]:
    try:
        load_validated_config(SMOKE, list(overrides), EvalMasterConfig)
    except ConfigError as error:
        return error.problems
    return []


def test_shipped_eval_configs_validate():
    assert problems_of() == []
    config = load_validated_config(REPO / "configs" / "evals" / "eval.yaml", [], EvalMasterConfig)
    assert (config.eval.metric, config.eval.k_value, config.data.dataset_name) == ("pass@k", 1, "aime2024")
    assert config.generation.max_new_tokens == config.data.max_input_seq_length == 2048
    assert validate_config({}, EvalMasterConfig).eval.num_tests_per_prompt == 1  # the schema defaults are valid


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["eval.k_value=5"], "eval.k_value: must be <= num_tests_per_prompt (5 > 4)"),
        (["eval.k_value=0"], "eval.k_value: must be >= 1, got 0"),
        (["eval.metric=pass@2"], "eval.metric: must be one of 'pass@k', 'cons@k', got 'pass@2'"),
        (["generation.temperature=0"], "eval.num_tests_per_prompt: 4 samples per problem with generation.temperature"),
        (["generation.num_prompts_per_step=0"], "generation.num_prompts_per_step: must be >= 1, or -1 for all prompts"),
        (
            ["generation.colocated.enabled=false", "generation.colocated.resources={gpus_per_node: 1, num_nodes: 1}"],
            "generation.colocated.enabled: evaluation runs only generation engines",
        ),
        (["data.max_input_seq_length=200"], "data.max_input_seq_length: must be <= generation.vllm_cfg.max_model_len"),
        (["env.reasoning_gym=null"], "env.reasoning_gym: required: it scores data.dataset_name 'reasoning_gym'"),
        (["data.dataset_name=DeepScaler"], "data.dataset_name: unknown dataset 'DeepScaler'"),
        (["data.problem_key=question"], "data.problem_key: only used by dataset_name 'local'"),
        (["data.dataset_name=local", "data.reasoning_gym=null"], "data.data_path: required for dataset_name 'local'"),
        (
            ["++tokenizer.chat_template_kwargs={add_generation_prompt: true}"],
            "tokenizer.chat_template_kwargs.add_generation_prompt: must be a template variable name",
        ),
        (["++logger={num_val_samples_to_print: 2}"], "logger.num_val_samples_to_print: only GRPO prints validation"),
    ],
)
def test_bad_eval_config_names_the_key(overrides, expected):
    found = problems_of(*overrides)
    assert any(problem.startswith(expected) for problem in found), found

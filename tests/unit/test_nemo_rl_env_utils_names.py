"""NeMo-RL v0.7.0's environment, generation-config, checkpoint and utils names at their paths (issue 53): each
behaves as NeMo-RL's on a tiny input, expected values worked out by hand from NeMo-RL's rules."""

from __future__ import annotations

import pytest
import torch

from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError


def test_rewards_read_the_tagged_answer() -> None:
    from nemo_rl_clone.environments import rewards

    assert rewards.format_reward("x", "<think>hm</think> <answer>4</answer>") == (1.0, None)
    assert rewards.format_reward("x", "<answer>4</answer>") == (0.75, None)
    assert rewards.format_reward("x", "<think>hm</think>", think_tag="think", answer_tag="ans") == (0.25, None)
    assert rewards.exact_answer_alphanumeric_reward("Paris", "<answer> paris. </answer>") == (1.0, True)
    assert rewards.exact_answer_alphanumeric_reward("Paris", "paris") == (0.0, False)  # no tags: no answer
    # greedy: from the first <answer> to the last </answer>
    assert rewards.exact_answer_alphanumeric_reward("12", "<answer>1</answer><answer>2</answer>") == (0.0, False)
    assert rewards.math_expression_reward("\\frac{1}{2}", "<answer>0.5</answer>") == (1.0, True)
    assert rewards.math_expression_reward("3", "<sol>3</sol>", tag="sol") == (1.0, True)
    assert rewards.math_expression_reward("3", "<answer>4</answer>") == (0.0, False)


def test_combined_rewards_are_a_renormalised_weighted_mean() -> None:
    from nemo_rl_clone.environments import rewards

    combined = rewards.combine_reward_functions(
        [(rewards.format_reward, 1.0), (rewards.exact_answer_alphanumeric_reward, 3.0)]
    )
    # format 0.75 (no think block) weighs 1/4, the exact answer 1.0 weighs 3/4; format's None is not a verdict
    assert combined("b", "<answer>B</answer>") == (pytest.approx(0.75 * 0.25 + 0.75), True)
    assert combined("c", "<think>.</think><answer>B</answer>") == (pytest.approx(0.25), False)


def test_image_rewards_are_refused_by_name() -> None:
    from nemo_rl_clone.environments import rewards

    with pytest.raises(UnsupportedFeatureError, match="bbox_giou_reward: not supported yet: vision"):
        rewards.bbox_giou_reward  # noqa: B018


def test_dapo_verifier_pieces() -> None:
    from nemo_rl_clone.environments import dapo_math_verifier as dapo

    assert dapo.last_boxed_only_string("\\boxed{1} then \\boxed{\\frac{a}{b}} end") == "\\boxed{\\frac{a}{b}}"
    assert dapo.last_boxed_only_string("\\boxed{1} \\boxed{2") is None  # the last box is never closed
    assert dapo.last_boxed_only_string("no box") is None
    assert dapo.remove_boxed("\\boxed{x+1}") == "x+1"
    with pytest.raises(ValueError, match="remove_boxed"):
        dapo.remove_boxed("x+1")
    assert ("mbox", "text") in dapo.SUBSTITUTIONS and "ft" not in dapo.REMOVED_EXPRESSIONS
    assert dapo.normalize_final_answer("5 ft") == "5ft"  # NeMo-RL's list keeps "ft" (Minerva's drops it)
    assert dapo.is_correct_minerva("so\nAnswer: 1,000 dollars", "1000") == (True, "1000")
    assert dapo.is_correct_minerva("no answer line", "7") == (False, "[INVALID]")
    assert dapo.is_correct_minerva("Answer: 7", "the sum is \\boxed{7}", gt_need_extract=True) == (True, "7")
    assert dapo.is_correct_minerva("Result= 9", "9", answer_pattern=r"Result\s*=\s*(\S+)") == (True, "9")
    assert dapo.is_correct_strict_box("thus \\boxed{42}", "42") == (1, "42")
    assert dapo.is_correct_strict_box("thus \\boxed{42.0}", "42") == (-1, "42.0")  # as written, not normalised
    assert dapo.is_correct_strict_box("no box", "42") == (-1, None)
    assert dapo.verify("Answer: \\frac12", "\\frac{1}{2}") == (True, "\\frac{1}{2}")
    assert dapo.verify("Answer: 3 \\boxed{4}", "4", strict_box_verify=True) == (True, "4")


def test_pass_rate_counts_distinct_prompts_with_a_correct_response() -> None:
    from nemo_rl_clone.environments.metrics import calculate_pass_rate_per_prompt

    prompts = torch.tensor([[1, 2], [1, 2], [3, 4], [5, 6]])
    assert calculate_pass_rate_per_prompt(prompts, torch.tensor([0.0, 1.0, 0.0, 0.0])) == pytest.approx(1 / 3)
    assert calculate_pass_rate_per_prompt(prompts, torch.tensor([True, False, False, True])) == pytest.approx(2 / 3)
    assert calculate_pass_rate_per_prompt(prompts, torch.tensor([-1.0, -1.0, 0.0, 0.0])) == 0.0  # > 0 counts


def test_environment_utils() -> None:
    from nemo_rl_clone.environments.utils import EnvRegistryEntry, chunk_list_to_workers

    assert chunk_list_to_workers([1, 2, 3, 4, 5], 3) == [[1, 2], [3, 4], [5]]
    assert chunk_list_to_workers([1, 2, 3, 4], 3) == [[1, 2], [3, 4]]  # ceil(4/3) = 2 per chunk: two chunks
    assert chunk_list_to_workers([1, 2], 4) == [[1], [2], [], []]
    assert chunk_list_to_workers([], 2) == [[], []]
    entry: EnvRegistryEntry = {"actor_class_fqn": "pkg.mod.Cls"}
    assert EnvRegistryEntry.__optional_keys__ >= {"actor_class_fqn", "default_processor"} and entry


def test_answer_parsing() -> None:
    import re

    from nemo_rl_clone.evals import answer_parsing as ap

    pattern = ap.MULTILINGUAL_ANSWER_PATTERN_TEMPLATE.format(ap.MULTILINGUAL_ANSWER_REGEXES[0])
    assert re.search(pattern, "so... answer:  c").group(1) == "c"  # case-insensitive
    assert any(
        re.search(ap.MULTILINGUAL_ANSWER_PATTERN_TEMPLATE.format(r), "Antwort: B")
        for r in ap.MULTILINGUAL_ANSWER_REGEXES
    )
    assert ap.normalize_extracted_answer("ب") == "B"
    assert ap.normalize_extracted_answer(" Ｃ ") == "C"
    assert ap.normalize_response("**Answer: $\\boxed{A}$**") == "Answer: A"
    assert ap.normalize_response("\\text{B}") == "B}"  # only "}$" closings go

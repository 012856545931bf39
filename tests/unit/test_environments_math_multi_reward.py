"""`math_multi_reward`: the three reward components of a response, by hand, and how they reach GDPO's batch keys."""

from __future__ import annotations

import pytest
import torch

from nemo_rl_clone.algorithms.grpo.config import GRPOConfig
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.environments.interfaces import reward_component_keys
from nemo_rl_clone.environments.math_multi_reward_environment import (
    MultiRewardMathWorker,
    format_reward,
    tagged_answer,
)
from nemo_rl_clone.rollout.rewards import accuracy_reward, process_rewards
from nemo_rl_clone.utils.config_validation import validate_config

FORMATTED = "<think>\n6 * 7 = 42\n</think>\n<answer>42</answer>"


@pytest.fixture(scope="module")
def worker() -> MultiRewardMathWorker:
    return MultiRewardMathWorker(call_timeout_s=5)


# (response, gold) -> (correctness, integer, format), each worked out from the rules in the module docstring.
CASES = [
    (FORMATTED, "42", (1.0, 1.0, 1.0)),  # right, digits, formatted
    ("<answer>42</answer>", "42", (1.0, 1.0, 0.0)),  # right, no <think> block: not formatted
    ("42", "42", (1.0, 1.0, 0.0)),  # no tags: the whole response is the answer
    (FORMATTED.replace("42</answer>", "41</answer>"), "42", (0.0, 1.0, 1.0)),  # wrong, still digits and format
    ("<think>x</think>\n<answer>42.0</answer>", "42", (1.0, 0.0, 1.0)),  # equal value, not all digits
    ("<think>x</think>\n<answer>\\frac{1}{2}</answer>", "0.5", (1.0, 0.0, 1.0)),  # math-verify, not string equality
    ("<think>x</think><answer>42</answer>", "42", (1.0, 1.0, 0.0)),  # no newline between the blocks
    (FORMATTED + "\nmore", "42", (1.0, 1.0, 0.0)),  # text after </answer>
    ("<think>a</think>\n<answer>1</answer><answer>42</answer>", "42", (1.0, 1.0, 0.0)),  # two tags: the last counts
    ("no answer at all", "42", (0.0, 0.0, 0.0)),
]


@pytest.mark.parametrize(("response", "gold", "expected"), CASES)
def test_components_by_hand(worker: MultiRewardMathWorker, response: str, gold: str, expected: tuple) -> None:
    result = worker.score(response, gold)
    assert result.status == "ok"
    assert result.components == expected
    assert result.reward == sum(expected)
    assert result.answer == tagged_answer(response)


def test_tag_and_format_rules() -> None:
    assert tagged_answer("a <answer> 7 </answer> b") == "7"
    assert tagged_answer("  plain 7 \n") == "plain 7"
    assert tagged_answer("<answer>1</answer> then <answer>2") == "2"  # after the last opening tag, unclosed
    assert format_reward("<think>\nmulti\nline\n</think>\n<answer>\n3\n</answer>") == 1.0  # DOTALL
    assert format_reward(" <think>a</think>\n<answer>3</answer>") == 0.0  # must start the response
    assert format_reward("<think>a</think>\n<answer>3</answer>\n") == 1.0  # `$` allows one final newline


def test_an_unparseable_gold_answer_scores_zero_on_every_component(worker: MultiRewardMathWorker) -> None:
    with pytest.raises(ValueError, match="could not parse the ground truth"):
        worker.score(FORMATTED, "")  # the pool turns this into status "error": reward 0, components None (zeros)


def test_component_keys_are_ordered_by_number() -> None:
    batch = {"reward10": 0, "reward2": 0, "total_reward": 0, "reward1": 0, "reward_x": 0, "rewards": 0}
    assert reward_component_keys(batch) == ["reward1", "reward2", "reward10"]


def test_reward_scaling_rescales_each_component_and_shaping_leaves_them() -> None:
    """Scaling [0, 1] -> [-1, 1] maps r to 2r - 1 on every component; the overlong penalty changes only the total."""
    cfg = validate_config(
        {
            "reward_scaling": {"enabled": True, "target_min": -1.0, "target_max": 1.0, "source_max": 3.0},
            "reward_shaping": {"enabled": True, "max_response_length": 4, "overlong_buffer_length": 2},
        },
        GRPOConfig,
    )
    assistant = {"role": "assistant", "token_ids": torch.arange(4)}  # 4 tokens: the full penalty, -1
    batch = BatchedDataDict(
        total_reward=torch.tensor([3.0, 0.0]),
        reward1=torch.tensor([1.0, 0.0]),
        reward2=torch.tensor([1.0, 0.0]),
        message_log=[[assistant], [assistant]],
    )
    shaped, unshaped = process_rewards(batch, cfg)
    # source [0, 3] -> [-1, 1]: r -> -1 + 2r/3; components 1 -> -1/3, 0 -> -1
    torch.testing.assert_close(unshaped, torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(shaped, torch.tensor([0.0, -2.0]))
    torch.testing.assert_close(batch["reward1"], torch.tensor([-1 / 3, -1.0]))
    torch.testing.assert_close(batch["reward2"], torch.tensor([-1 / 3, -1.0]))


def test_accuracy_counts_correctness_not_the_sum_of_components() -> None:
    """With several components `accuracy` counts the first (correctness) before scaling rescales it in place: here
    total_reward 1 is a wrong answer with a good format, and the sample with total 3 is the correct one."""
    cfg = validate_config(
        {"reward_scaling": {"enabled": True, "target_min": -1.0, "target_max": 1.0, "source_max": 3.0}}, GRPOConfig
    )
    batch = BatchedDataDict(
        total_reward=torch.tensor([3.0, 1.0, 0.0]),
        reward1=torch.tensor([1.0, 0.0, 0.0]),
        reward2=torch.tensor([1.0, 0.0, 0.0]),
        reward3=torch.tensor([1.0, 1.0, 0.0]),
        message_log=[[], [], []],
    )
    assert torch.equal(accuracy_reward(batch), torch.tensor([1.0, 0.0, 0.0]))
    process_rewards(batch, cfg)
    assert torch.equal(batch["accuracy_reward"], torch.tensor([1.0, 0.0, 0.0]))  # unscaled
    single = BatchedDataDict(total_reward=torch.tensor([1.0, 0.0]), message_log=[[], []])
    assert torch.equal(accuracy_reward(single), torch.tensor([1.0, 0.0]))

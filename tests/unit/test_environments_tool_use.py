"""The tool-use environment: the calculator's safety, the call format, episodes of calls then an answer."""

from __future__ import annotations

import re

import pytest

from nemo_rl_clone.environments.config import ToolUseEnvConfig
from nemo_rl_clone.environments.tool_use_environment import (
    ToolError,
    ToolUseEnvironment,
    answers_match,
    calculate,
    parse_call,
)


@pytest.mark.parametrize(
    ("expression", "value"),
    [("17 * 23", "391"), ("(1 + 2) ** 3 - 4 / 2", "25"), ("7 / 2", "3.5"), ("-3 // 2", "-2"), ("10 % 4", "2")],
)
def test_calculator_computes_arithmetic(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('id')", "Call is not allowed"),
        ("open('/etc/passwd').read()", "Call is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("'a' * 10", "Constant is not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("2 ** 10 ** 10", "exponent or base too large"),
        ("1 / 0", "division by zero"),
        ("10.0 ** 99 * 10.0 ** 99", "result out of range"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 501, "expression longer than 500 characters"),
    ],
)
def test_calculator_refuses_everything_else(expression: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        calculate(expression)


def test_call_format() -> None:
    assert parse_call(
        'I will compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    ) == (
        "calculator",
        {"expression": "2+2"},
    )
    assert parse_call("The answer is 4.") is None
    with pytest.raises(ToolError, match="the tool call is not JSON"):
        parse_call("<tool_call>calculator(2+2)</tool_call>")
    with pytest.raises(ToolError, match=re.escape('a tool call is {"name": str, "arguments"')):
        parse_call('<tool_call>{"name": "calculator"}</tool_call>')


def test_answers_compare_as_numbers_or_text() -> None:
    assert answers_match("84.0", "84") and answers_match("1,234", "1234") and not answers_match("85", "84")
    assert answers_match(" Paris", "Paris") and not answers_match(None, "84")


def episode(env: ToolUseEnvironment, turns: list[str], metadata: dict) -> list[tuple]:
    """Play ``turns`` as successive assistant messages of one episode: (reply, reward, done, answer) per turn."""
    log: list[dict[str, str]] = [{"role": "user", "content": "What is 17 * 23?"}]
    played = []
    for text in turns:
        log.append({"role": "assistant", "content": text})
        result = env.step([log], [metadata])
        metadata = result.metadata[0]
        played.append(
            (
                result.observations[0]["content"],
                float(result.rewards[0]),
                bool(result.terminateds[0]),
                result.answers[0],
            )
        )
        log.append(result.observations[0])
    return played


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'


def test_episode_of_a_call_then_the_answer() -> None:
    env = ToolUseEnvironment(ToolUseEnvConfig(max_tool_calls=2))
    played = episode(env, [CALL, "So it is <answer>391</answer>."], {"ground_truth": "391"})
    assert played == [("391", 0.0, False, None), ("", 1.0, True, "391")]
    # A reasoning-gym row's gold answer works too; a wrong answer scores 0; a direct answer needs no call.
    assert episode(env, ["It is 392."], {"entry": {"answer": "391"}}) == [("", 0.0, True, "392")]
    env.step([[{"role": "assistant", "content": "x"}]] * 0, [])  # an empty batch is fine
    _, metrics = env.global_post_process_and_metrics({"rewards": [1.0, 0.0], "turns": [2, 1]})
    assert metrics == {"accuracy": 0.5, "calls": 1.0, "tool_errors": 0.0, "mean_turns": 1.5}


def test_bad_calls_are_answered_and_the_call_budget_ends_the_episode() -> None:
    env = ToolUseEnvironment(ToolUseEnvConfig(max_tool_calls=2))
    played = episode(
        env,
        ['<tool_call>{"name": "search", "arguments": {}}</tool_call>', "<tool_call>17*23</tool_call>", CALL],
        {"ground_truth": "391"},
    )
    assert played[0] == ("error: unknown tool 'search'; tools: calculator", 0.0, False, None)
    assert played[1] == (
        "error: the tool call is not JSON: Extra data\nNo tool calls left: answer now.",
        0.0,
        False,
        None,
    )
    assert played[2] == ("", 0.0, True, None)  # a third call is over the budget of 2
    _, metrics = env.global_post_process_and_metrics({"rewards": [0.0]})
    assert metrics["calls"] == 2.0 and metrics["tool_errors"] == 2.0


def test_metadata_without_a_gold_answer_is_named() -> None:
    env = ToolUseEnvironment(ToolUseEnvConfig())
    with pytest.raises(ValueError, match="sample 0: tool-use metadata needs 'ground_truth'"):
        env.step([[{"role": "assistant", "content": "4"}]], [{"question": "2+2"}])
    with pytest.raises(ValueError, match=r"invalid env.tool_use config: tools: choose from \['calculator', 'python'\]"):
        ToolUseEnvironment(ToolUseEnvConfig(tools=["browser"]))

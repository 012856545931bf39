"""`ToolUseEnvironment` (``env.tool_use``): the model may call tools before it answers; the answer is scored.

Call format (Hermes-style, what tool-calling chat templates of Qwen and others emit), one call per turn::

    <tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>

Generation stops after ``</tool_call>``; the environment runs the tool and answers with its result as a ``tool``
message (chat-templated by the rollout like every observation), and the episode goes on. A turn without a call is the
final answer: its answer (``answer_extraction``, ``auto`` by default: answer tag, else \\boxed{}, else the last number)
is compared with the gold answer (metadata ``ground_truth``, or a reasoning-gym entry's ``answer``) as numbers when
both are numbers, else as stripped text: reward 1.0 or 0.0. After ``max_tool_calls`` calls the next call ends the
episode with 0. A malformed call (not JSON, unknown tool, bad arguments) is answered with the error, costs a call,
and the episode goes on.

Tools: ``calculator`` (arithmetic on numbers: + - * / // % ** and parentheses, evaluated from the parsed syntax tree,
never ``eval``; exponents and results bounded), ``python`` (a program run in the process sandbox of
`environments.sandbox`: its stdout, or its error, is the result).
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from nemo_rl_clone.environments.answer_extraction import extract_answer
from nemo_rl_clone.environments.config import ToolUseEnvConfig, check_env_config
from nemo_rl_clone.environments.interfaces import (
    EnvironmentInterface,
    EnvironmentReturn,
    check_step_batch,
    last_assistant_text,
)

TOOL_CALL_STOP_STRINGS = ["</tool_call>"]
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_MAX_RESULT_CHARS = 2000


class ToolError(ValueError):
    """A tool call that cannot run; its message is what the model reads back."""


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression; ToolError naming what is not allowed."""
    if len(expression) > 500:
        raise ToolError("expression longer than 500 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ToolError(f"not an arithmetic expression: {error.msg}") from None

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 100 or abs(left) > 1e6):
                raise ToolError("exponent or base too large")
            try:
                result = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
            if isinstance(result, complex) or abs(result) > 1e30:
                raise ToolError("result out of range")
            return result
        raise ToolError(f"{type(node).__name__} is not allowed (numbers, + - * / // % ** and parentheses only)")

    result = value(tree.body)
    if isinstance(result, float) and result.is_integer():
        return str(int(result))
    return repr(result) if isinstance(result, float) else str(result)


def parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """(tool name, arguments) of the last ``<tool_call>`` in ``text``, None without one; ToolError when malformed."""
    found = _CALL.findall(text)
    if not found:
        return None
    try:
        call = json.loads(found[-1])
    except json.JSONDecodeError as error:
        raise ToolError(f"the tool call is not JSON: {error.msg}") from None
    if (
        not isinstance(call, dict)
        or not isinstance(call.get("name"), str)
        or not isinstance(call.get("arguments"), dict)
    ):
        raise ToolError('a tool call is {"name": str, "arguments": {...}}')
    return call["name"], call["arguments"]


def answers_match(answer: str | None, gold: str) -> bool:
    """Numbers compare as numbers (``"84.0"`` matches ``"84"``), anything else as stripped text."""
    if answer is None:
        return False
    try:
        return math.isclose(float(answer.replace(",", "")), float(gold), rel_tol=1e-9, abs_tol=1e-9)
    except ValueError:
        return answer.strip() == gold.strip()


def gold_answer(metadata: Mapping[str, Any], sample_index: int) -> str:
    if "ground_truth" in metadata:
        return str(metadata["ground_truth"])
    entry = metadata.get("entry")
    if isinstance(entry, Mapping) and "answer" in entry:
        return str(entry["answer"])
    raise ValueError(
        f"sample {sample_index}: tool-use metadata needs 'ground_truth' (math rows) or a reasoning-gym 'entry' with an "
        f"'answer'; it has {sorted(metadata)}"
    )


class ToolUseEnvironment(EnvironmentInterface):
    """Runs each episode's tool calls and scores its final answer (made a Ray actor by `create_env`)."""

    config_class = ToolUseEnvConfig

    def __init__(self, cfg: ToolUseEnvConfig):
        check_env_config("tool_use", cfg)
        self.cfg = cfg
        self._counts = {"calls": 0, "tool_errors": 0}
        if "python" in cfg.tools:
            from nemo_rl_clone.environments import sandbox

            self._sandbox = sandbox
            self._limits = sandbox.SandboxLimits(wall_s=cfg.python_timeout_s)
            sandbox.check_sandbox_available(self._limits)  # fail at start, not at the first call

    def step(self, message_log_batch: list[list[dict[str, Any]]], metadata: list[dict[str, Any]]) -> EnvironmentReturn:
        check_step_batch(message_log_batch, metadata)
        results = [
            self._turn(last_assistant_text(log, i), info, i)
            for i, (log, info) in enumerate(zip(message_log_batch, metadata, strict=True))
        ]
        return EnvironmentReturn(
            observations=[{"role": "tool", "content": r[0]} for r in results],
            metadata=[r[1] for r in results],
            next_stop_strings=[list(TOOL_CALL_STOP_STRINGS)] * len(results),
            rewards=torch.tensor([r[2] for r in results], dtype=torch.float32),
            terminateds=torch.tensor([r[3] for r in results], dtype=torch.bool),
            answers=[r[4] for r in results],
        )

    def _turn(
        self, text: str, info: Mapping[str, Any], index: int
    ) -> tuple[str, dict[str, Any], float, bool, str | None]:
        calls = int(info.get("tool_calls", 0))
        try:
            call = parse_call(text)
        except ToolError as error:
            return self._after_call(f"error: {error}", info, calls, tool_error=True)
        if call is None:  # no call: this is the final answer
            answer = extract_answer(text, self.cfg.answer_extraction)
            reward = 1.0 if answers_match(answer, gold_answer(info, index)) else 0.0
            return "", dict(info), reward, True, answer
        if calls >= self.cfg.max_tool_calls:
            return "", {**info, "tool_calls": calls}, 0.0, True, None
        name, arguments = call
        try:
            reply = self._run(name, arguments)
            tool_error = False
        except ToolError as error:
            reply, tool_error = f"error: {error}", True
        return self._after_call(reply, info, calls, tool_error)

    def _after_call(
        self, reply: str, info: Mapping[str, Any], calls: int, tool_error: bool
    ) -> tuple[str, dict[str, Any], float, bool, str | None]:
        self._counts["calls"] += 1
        self._counts["tool_errors"] += int(tool_error)
        calls += 1
        if calls >= self.cfg.max_tool_calls:
            reply += "\nNo tool calls left: answer now."
        return reply[:_MAX_RESULT_CHARS], {**info, "tool_calls": calls}, 0.0, False, None

    def _run(self, name: str, arguments: Mapping[str, Any]) -> str:
        if name not in self.cfg.tools:
            raise ToolError(f"unknown tool {name!r}; tools: {', '.join(self.cfg.tools)}")
        if name == "calculator":
            expression = arguments.get("expression")
            if not isinstance(expression, str):
                raise ToolError('calculator takes {"expression": str}')
            return calculate(expression)
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError('python takes {"code": str}')
        result = self._sandbox.run_in_sandbox(code, self._limits)
        if result.status != "ok":
            raise ToolError(f"{result.reason}\n{result.stderr[-500:]}".strip())
        return result.stdout

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """Reads ``rewards`` [B] and optional ``turns`` [B]: accuracy, tool calls and tool errors since the last call."""
        rewards = torch.as_tensor(batch["rewards"], dtype=torch.float32)
        metrics = {"accuracy": float((rewards == 1.0).float().mean()) if len(rewards) else 0.0}
        metrics.update({name: float(count) for name, count in self._counts.items()})
        if "turns" in batch:
            metrics["mean_turns"] = float(torch.as_tensor(batch["turns"], dtype=torch.float32).mean())
        self._counts = dict.fromkeys(self._counts, 0)
        return batch, metrics

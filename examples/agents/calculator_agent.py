"""The calculator tool-use task (``configs/grpo_tool_use.yaml``) as an agent: an ordinary loop over the ``openai``
client and its tool-calling format (docs/agents.md).

The model may call ``calculator`` up to ``MAX_TOOL_CALLS`` times, each result coming back as a ``tool`` message, then
answers ``<answer>N</answer>``. Reward 1 when the answer equals the row's, else 0. Rows are reasoning-gym rows (their
``entry`` holds ``question`` and ``answer``) or math rows (``ground_truth``; the question is then the ``question``
key). The server parses tool calls (``http_server_serving_chat_kwargs``: ``enable_auto_tools``, ``tool_parser:
hermes``); the agent sets no sampling option, so requests sample with the run's ``policy.generation`` settings.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_rl_clone.environments.answer_extraction import extract_answer
from nemo_rl_clone.environments.tool_use_environment import ToolError, answers_match, calculate, gold_answer

MAX_TOOL_CALLS = 2
MAX_TOKENS = 96
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "The value of an arithmetic expression (numbers, + - * / // % ** and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
# The chat template of a small model may not render tool definitions: the format is spelled out in the prompt.
INSTRUCTIONS = (
    "You have a calculator. To use it, write a tool call like this and stop:\n"
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>\n'
    "The result comes back in the next message. When you know the answer, write it like this: <answer>408</answer>"
)


async def run(client: Any, row: dict[str, Any]) -> dict[str, Any]:
    model = (await client.models.list()).data[0].id
    question = row["entry"]["question"] if "entry" in row else row["question"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"{INSTRUCTIONS}\n\nQuestion: {question}"}]
    calls = 0
    while True:
        reply = await client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR], max_tokens=MAX_TOKENS, stop=["</tool_call>"]
        )
        message = reply.choices[0].message
        if not message.tool_calls or calls == MAX_TOOL_CALLS:
            answer = extract_answer(message.content or "", "auto")
            correct = answers_match(answer, gold_answer(row, 0))
            return {"reward": 1.0 if correct else 0.0, "metadata": {"tool_calls": calls}}
        calls += 1
        call = message.tool_calls[0]
        try:
            arguments = json.loads(call.function.arguments)
            result = calculate(str(arguments["expression"])) if call.function.name == "calculator" else "unknown tool"
        except (ToolError, ValueError, KeyError, TypeError) as error:
            arguments, result = call.function.arguments, f"error: {error}"
        # The call goes back as the text the model wrote: a small model's chat template drops `tool_calls`.
        written = json.dumps({"name": call.function.name, "arguments": arguments})
        messages.append({"role": "assistant", "content": f"{message.content or ''}<tool_call>{written}</tool_call>"})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

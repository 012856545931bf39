"""A two-step math agent (docs/agents.md): it drafts a solution, then is asked to check the draft and give the final
answer, in one conversation. Reward 1 when the final ``<answer>`` equals the row's answer (reasoning-gym rows: their
``entry``; math rows: ``ground_truth``), else 0.

The second request repeats the first exchange, so the episode is one training sample when the chat template renders
the draft back as the tokens the model generated; otherwise it trains as one sample per call (docs/agents.md).
"""

from __future__ import annotations

from typing import Any

from nemo_rl_clone.environments.answer_extraction import extract_answer
from nemo_rl_clone.environments.tool_use_environment import answers_match, gold_answer

DRAFT_TOKENS = 128
ANSWER_TOKENS = 48


async def run(client: Any, row: dict[str, Any]) -> dict[str, Any]:
    model = (await client.models.list()).data[0].id
    question = row["entry"]["question"] if "entry" in row else row["question"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Solve step by step: {question}"}]
    draft = await client.chat.completions.create(model=model, messages=messages, max_tokens=DRAFT_TOKENS)
    messages.append({"role": "assistant", "content": draft.choices[0].message.content or ""})
    messages.append(
        {"role": "user", "content": "Check your work. Then give only the final answer like this: <answer>42</answer>"}
    )
    final = await client.chat.completions.create(model=model, messages=messages, max_tokens=ANSWER_TOKENS)
    answer = extract_answer(final.choices[0].message.content or "", "auto")
    return {"reward": 1.0 if answers_match(answer, gold_answer(row, 0)) else 0.0}

"""The agent of tests/functional/test_agents.py: episode ``n`` (in the order episodes start) does behaviour ``n % 5``,
so every 8-episode batch has each: an append-only two-call episode (completions on token ids, the second prompt
extending the first call's context exactly), an episode that rewrites its context (two unrelated chats), one that
raises, one that returns no reward, and one that hangs past ``env.agent.timeout_s`` (in the first batch only: a
hang holds its step for the whole timeout)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

_episodes = itertools.count()


async def run(client: Any, row: dict[str, Any]) -> Any:
    episode = next(_episodes)
    behaviour = episode % 5
    model = (await client.models.list()).data[0].id
    if behaviour == 0:
        first = await client.completions.create(
            model=model, prompt="Question: 2 + 3 =", max_tokens=6, extra_body={"return_token_ids": True}
        )
        choice = first.choices[0]
        context = list(choice.prompt_token_ids) + list(choice.token_ids)
        follow_up = context + list(choice.prompt_token_ids[:3])  # tokens the agent adds: trained on never
        second = await client.completions.create(model=model, prompt=follow_up, max_tokens=4)
        return float(len(second.choices[0].text) % 2)
    if behaviour == 1:
        first = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Draft an answer."}], max_tokens=6
        )
        second = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Something else entirely."}], max_tokens=5
        )
        return {"reward": float(len(first.choices[0].message.content or "") % 2), "metadata": {"drafts": 2}}
    if behaviour == 2:
        raise ValueError("the agent's own bug")
    if behaviour == 3 and episode < 5:
        await asyncio.sleep(600)
    return "not a reward"

"""A user's agent named by path runs one episode per row (`environments/agent_runner.py`): rewards come back in row
order, user failures (exception, timeout, garbage, a server that does not answer) end that episode only with reward 0
and a named failure, every request carries its episode's id, and no more than ``concurrency`` episodes run at once.

The client is a real ``openai.AsyncOpenAI``; its URL is a closed local port (nothing serves it in these tests)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import openai
import pytest

from nemo_rl_clone.contract.episode import EPISODE_HEADER
from nemo_rl_clone.environments.agent_runner import (
    AgentLoadError,
    episode_result,
    failure_metrics,
    load_agent,
    run_episodes,
)

AGENTS = '''
import asyncio

RUNNING = {"now": 0, "most": 0}


async def by_kind(client, row):
    """Does what the row says."""
    kind = row["kind"]
    if kind == "reward":
        return row["value"]
    if kind == "dict":
        return {"reward": 0.5, "metadata": {"episode": client.default_headers["X-Episode-Id"]}}
    if kind == "raise":
        raise RuntimeError("the tool broke")
    if kind == "hang":
        await asyncio.sleep(60)
    if kind == "garbage":
        return "five"
    if kind == "nan":
        return float("nan")
    if kind == "call":
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError(kind)


async def counted(client, row):
    RUNNING["now"] += 1
    RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
    await asyncio.sleep(0.01)
    RUNNING["now"] -= 1
    return 1


def not_async(client, row):
    return 1


class Agent:
    async def __call__(self, client, row):
        return 0.75


agent_instance = Agent()
'''


@pytest.fixture
def agents_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_agents.py"
    path.write_text(textwrap.dedent(AGENTS))
    return path


@pytest.fixture
def client() -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0, timeout=5)


def test_rewards_and_failures_come_back_in_row_order(agents_file: Path, client: openai.AsyncOpenAI) -> None:
    agent = load_agent(f"{agents_file}:by_kind", "env.agent.function")
    rows = [
        {"kind": "reward", "value": 1},
        {"kind": "dict"},
        {"kind": "raise"},
        {"kind": "hang"},
        {"kind": "garbage"},
        {"kind": "nan"},
        {"kind": "call"},
        {"kind": "reward", "value": 0.25},
    ]
    ids = [f"ep{i}" for i in range(len(rows))]
    results = asyncio.run(run_episodes(agent, client, rows, ids, concurrency=4, timeout_s=0.5))
    assert [r.episode_id for r in results] == ids
    assert [r.reward for r in results] == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.25]
    # The episode's id rides on every request of the episode (the agent above reads the header by its name).
    assert EPISODE_HEADER == "X-Episode-Id" and results[1].metadata == {"episode": "ep1"}
    failures = [r.failure for r in results]
    assert failures[0] is None and failures[1] is None and failures[7] is None
    assert failures[2] == "exception: RuntimeError: the tool broke"
    assert failures[3] == "timeout after 0.5 s"
    assert failures[4] == "malformed result: 'five' (expected a finite reward)"
    assert failures[5] == "malformed result: nan (expected a finite reward)"
    assert failures[6].startswith("exception: APIConnectionError")
    metrics = failure_metrics(results)
    assert metrics == {
        "agent/timeout_rate": 1 / 8,
        "agent/exception_rate": 2 / 8,
        "agent/malformed_result_rate": 2 / 8,
    }


def test_no_more_than_concurrency_episodes_run_at_once(agents_file: Path, client: openai.AsyncOpenAI) -> None:
    agent = load_agent(f"{agents_file}:counted", "env.agent.function")
    rows = [{}] * 10
    results = asyncio.run(run_episodes(agent, client, rows, [str(i) for i in range(10)], concurrency=3, timeout_s=5))
    assert [r.reward for r in results] == [1.0] * 10
    assert agent.__globals__["RUNNING"]["most"] == 3


def test_result_shapes() -> None:
    class Result:
        def __init__(self) -> None:
            self.reward, self.metadata = 2, {"turns": 3}

    assert episode_result("e", Result()).reward == 2.0 and episode_result("e", Result()).metadata == {"turns": 3}
    assert episode_result("e", True).failure == "malformed result: True (expected a finite reward)"
    assert episode_result("e", {"reward": 1, "metadata": [1]}).failure == "malformed result: metadata is list"


def test_an_unusable_agent_is_refused_in_one_line_naming_the_key(
    agents_file: Path, tmp_path: Path, client: openai.AsyncOpenAI
) -> None:
    key = "env.agent.function"
    cases = {
        f"{agents_file}": "must name a function as 'path/to/file.py:function' or 'module:function'",
        f"{tmp_path / 'missing.py'}:run": f"cannot import {tmp_path / 'missing.py'}: FileNotFoundError",
        "no_such_module_here:run": "cannot import no_such_module_here: ModuleNotFoundError",
        f"{agents_file}:nope": f"{agents_file} has no 'nope'",
        f"{agents_file}:not_async": "must be an async function: async def not_async(client, row) -> reward",
        f"{agents_file}:Agent": "must be an async function",  # the class; an instance of it is an agent
    }
    for spec, message in cases.items():
        with pytest.raises(AgentLoadError) as err:
            load_agent(spec, key)
        assert str(err.value).startswith(f"{key}: ") and message in str(err.value), (spec, str(err.value))
        assert "\n" not in str(err.value)
    instance = load_agent(f"{agents_file}:agent_instance", key)
    assert asyncio.run(run_episodes(instance, client, [{}], ["e"], concurrency=1, timeout_s=5))[0].reward == 0.75

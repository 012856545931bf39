"""Running a user's agent: ``async def run(client, row)`` named by path, one episode per dataset row.

The agent is ordinary code that talks to the policy through ``client``, a real ``openai.AsyncOpenAI`` pointed at the
run's model server; every request of an episode carries the episode's id (header `EPISODE_HEADER`), which is how the
server's records of its calls are joined back into training samples (`agent_trajectory.episode_samples`).

User code cannot end the run: an exception, a timeout or a result that is not a reward ends that episode with reward 0
and a named failure (counted in the rollout metrics), and the other episodes go on.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_clone.contract.episode import EPISODE_HEADER

AgentFn = Callable[[Any, Mapping[str, Any]], Awaitable[Any]]


class AgentLoadError(ValueError):
    """The agent named in the config cannot be used; the message names the key and the reason."""


@dataclass(frozen=True)
class EpisodeResult:
    """An episode's reward and metadata; ``failure`` names why user code did not give a reward (reward is then 0)."""

    episode_id: str
    reward: float
    metadata: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None


def load_agent(spec: str, key: str) -> AgentFn:
    """The coroutine function ``spec`` names: ``path/to/file.py:function`` or ``package.module:function``. ``key``
    is the config key that holds ``spec``, for the error message."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise AgentLoadError(f"{key}: {spec!r} must name a function as 'path/to/file.py:function' or 'module:function'")
    try:
        module = _import_file(Path(where)) if where.endswith(".py") else importlib.import_module(where)
    except Exception as err:  # the user's module failed to import: say which and why, in one line
        raise AgentLoadError(f"{key}: cannot import {where}: {type(err).__name__}: {err}") from None
    agent = getattr(module, name, None)
    if agent is None:
        raise AgentLoadError(f"{key}: {where} has no {name!r}")
    # an async function, or an instance of a class with an async __call__
    if not inspect.iscoroutinefunction(agent) and not (
        callable(agent) and inspect.iscoroutinefunction(type(agent).__call__)
    ):
        raise AgentLoadError(f"{key}: {spec} must be an async function: async def {name}(client, row) -> reward")
    return agent


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    module_name = f"nrl_agent_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None  # a .py file that exists
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


def episode_result(episode_id: str, value: Any) -> EpisodeResult:
    """An agent's return value as a result: a finite number, or a mapping / object with a numeric ``reward`` and an
    optional ``metadata`` mapping; anything else is a failure with reward 0."""
    reward = value.get("reward") if isinstance(value, Mapping) else getattr(value, "reward", value)
    metadata = value.get("metadata") if isinstance(value, Mapping) else getattr(value, "metadata", None)
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        shown = repr(value)[:80]
        return EpisodeResult(episode_id, 0.0, failure=f"malformed result: {shown} (expected a finite reward)")
    if metadata is not None and not isinstance(metadata, Mapping):
        return EpisodeResult(episode_id, 0.0, failure=f"malformed result: metadata is {type(metadata).__name__}")
    return EpisodeResult(episode_id, float(reward), dict(metadata or {}))


async def run_episode(
    agent: AgentFn, client: Any, row: Mapping[str, Any], episode_id: str, timeout_s: float
) -> EpisodeResult:
    """One episode, its requests tagged with ``episode_id``; never raises (but lets cancellation through)."""
    tagged = client.with_options(default_headers={EPISODE_HEADER: episode_id})
    try:
        value = await asyncio.wait_for(agent(tagged, row), timeout=timeout_s)
    except TimeoutError:
        return EpisodeResult(episode_id, 0.0, failure=f"timeout after {timeout_s:g} s")
    except Exception as err:  # user code: any failure ends this episode only
        return EpisodeResult(episode_id, 0.0, failure=f"exception: {type(err).__name__}: {err}"[:300])
    return episode_result(episode_id, value)


async def run_episodes(
    agent: AgentFn,
    client: Any,
    rows: Sequence[Mapping[str, Any]],
    episode_ids: Sequence[str],
    concurrency: int,
    timeout_s: float,
) -> list[EpisodeResult]:
    """Every row's episode, at most ``concurrency`` at a time; results in row order."""
    if len(rows) != len(episode_ids):
        raise ValueError(f"{len(rows)} rows but {len(episode_ids)} episode ids")
    slots = asyncio.Semaphore(concurrency)

    async def one(row: Mapping[str, Any], episode_id: str) -> EpisodeResult:
        async with slots:
            return await run_episode(agent, client, row, episode_id, timeout_s)

    return list(await asyncio.gather(*(one(row, eid) for row, eid in zip(rows, episode_ids, strict=True))))


def failure_metrics(results: Sequence[EpisodeResult]) -> dict[str, float]:
    """Rollout metrics of the episodes' failures: the fraction of each kind (timeout, exception, malformed result)."""
    total = max(len(results), 1)
    kinds = ("timeout", "exception", "malformed result")
    return {
        f"agent/{kind.replace(' ', '_')}_rate": sum(1 for r in results if (r.failure or "").startswith(kind)) / total
        for kind in kinds
    }

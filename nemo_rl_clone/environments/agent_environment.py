"""``env.agent``: the Ray actor that runs a user's agent episodes against the run's OpenAI-compatible servers.

User code runs here, not in the driver: whatever it does (block, leak, exit), the run's own process is untouched,
and an episode that fails ends with reward 0 (`agent_runner`). Each episode is pinned to one engine, so that engine's
records hold all of its calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from nemo_rl_clone.environments.agent_runner import EpisodeResult, load_agent, run_episodes
from nemo_rl_clone.environments.config import AgentEnvConfig


class AgentEnvironment:
    """``run_episodes`` plays one episode per row; it is not a turn-by-turn environment (`step` refuses)."""

    def __init__(self, cfg: AgentEnvConfig) -> None:
        self.cfg = cfg
        self.agent = load_agent(cfg.function, "env.agent.function")

    async def run_episodes(
        self, rows: Sequence[Mapping[str, Any]], episode_ids: Sequence[str], engines: Sequence[int], urls: Sequence[str]
    ) -> list[EpisodeResult]:
        """Episode ``i`` plays ``rows[i]`` against ``urls[engines[i]]``, its requests tagged ``episode_ids[i]``; at
        most ``concurrency_per_engine`` episodes per engine at a time. Results in row order. (An async method: Ray
        runs this actor's calls on its event loop.)"""
        import openai

        # No retries: a retried request may have been served (and recorded) already.
        clients = [openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) for url in urls]
        by_engine: dict[int, list[int]] = {}
        for index, engine in enumerate(engines):
            by_engine.setdefault(engine, []).append(index)
        try:
            groups = await asyncio.gather(
                *(
                    run_episodes(
                        self.agent,
                        clients[engine],
                        [rows[i] for i in indices],
                        [episode_ids[i] for i in indices],
                        self.cfg.concurrency_per_engine,
                        self.cfg.timeout_s,
                    )
                    for engine, indices in by_engine.items()
                )
            )
        finally:
            for client in clients:
                await client.close()
        results: list[EpisodeResult | None] = [None] * len(rows)
        for indices, group in zip(by_engine.values(), groups, strict=True):
            for index, result in zip(indices, group, strict=True):
                results[index] = result
        return [result for result in results if result is not None]

    def step(self, message_logs: Any, metadata: Any) -> Any:
        raise RuntimeError("env.agent plays whole episodes (run_episodes); it takes no turns")

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        return batch, {}

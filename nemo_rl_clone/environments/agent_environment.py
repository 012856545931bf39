"""``env.agent``: the Ray actor that runs a user's agent episodes against the run's OpenAI-compatible servers.

User code runs here, not in the driver: whatever it does (block, leak, exit), the run's own process is untouched,
and an episode that fails ends with reward 0 (`agent_runner`). Episodes talk to the router's one URL, which keeps
each episode on one engine (http_router.py).
"""

from __future__ import annotations

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
        self,
        rows: Sequence[Mapping[str, Any]],
        episode_ids: Sequence[str],
        url: str,
        engines: int,
        api_key: str | None = None,
    ) -> list[EpisodeResult]:
        """Episode ``i`` plays ``rows[i]`` against ``url`` (the router in front of ``engines`` engines, which wants
        ``api_key``: the agent's client carries it), its requests tagged ``episode_ids[i]``; at most ``concurrency_per_engine`` × ``engines`` episodes at a time. Results in
        row order. (An async method: Ray runs this actor's calls on its event loop.)"""
        import openai

        # No retries: a retried request may have been served (and recorded) already.
        async with openai.AsyncOpenAI(base_url=url, api_key=api_key or "unused", max_retries=0) as client:
            concurrency = self.cfg.concurrency_per_engine * engines
            return await run_episodes(self.agent, client, rows, episode_ids, concurrency, self.cfg.timeout_s)

    def step(self, message_logs: Any, metadata: Any) -> Any:
        raise RuntimeError("env.agent plays whole episodes (run_episodes); it takes no turns")

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        return batch, {}

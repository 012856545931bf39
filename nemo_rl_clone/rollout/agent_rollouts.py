"""Rollouts of agent episodes (``env.agent``, docs/agents.md): the user's agent talks to the engines over HTTP, and
the samples trained on are rebuilt from the engines' records of its calls, token for token.

The batch returned has the keys `run_multi_turn_rollout` returns, one row per episode. An episode whose agent
rewrote its context has one sample per call: the first is the row's ``message_log``, the others are in
``agent_extra_samples`` (`expand_agent_samples` turns them into rows of their own, with the episode's advantage,
once advantages are computed per episode). Such episodes can make a step's training batch larger than its rollout
batch: the trainer then takes more optimizer steps (the global batch size stays what it is).
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import ray
import torch
from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.environments.agent_runner import EpisodeResult, failure_metrics
from nemo_rl_clone.environments.agent_trajectory import episode_samples, first_context_break
from nemo_rl_clone.rollout.multi_turn import GENERATION_LOGPROBS
from nemo_rl_clone.utils import watchdog

EXTRA_SAMPLES = "agent_extra_samples"


def run_agent_rollout(
    generation: Any, input_batch: BatchedDataDict, tokenizer: PreTrainedTokenizerBase, agent_env: Any, max_seq_len: int
) -> tuple[BatchedDataDict, dict[str, float]]:
    """One episode per row of ``input_batch`` (from ``rl_collate_fn``), through the engines' router.

    The agent's ``row`` is the dataset row's ``extra_env_info`` (for reasoning-gym rows: ``task`` and ``entry`` with
    ``question`` and ``answer``) plus ``idx``. A sample longer than ``max_seq_len`` tokens keeps its first
    ``max_seq_len`` and is marked ``truncated``; an episode that made no call trains on nothing (loss multiplier 0).
    Metrics: ``mean_turns`` (calls per episode), ``truncation_rate``, ``natural_termination_rate`` (episodes that
    gave a reward), ``total_generated_tokens``, ``mean_generation_length``, ``agent/{timeout,exception,
    malformed_result}_rate``, ``agent/no_call_rate``, ``agent/context_break_rate``, ``agent/samples_per_episode``.
    """
    size = input_batch.size
    episode_ids, results, calls = _play_episodes(generation, input_batch, agent_env)
    batch = BatchedDataDict(input_batch.copy())
    batch["message_log"] = copy.deepcopy(list(input_batch["message_log"]))
    loss_multiplier = batch["loss_multiplier"].clone().float()
    truncated = torch.zeros(size, dtype=torch.bool)
    turns = torch.tensor([len(calls[episode_id]) for episode_id in episode_ids], dtype=torch.long)
    extra: list[list[Any]] = [[] for _ in range(size)]
    generated_tokens, breaks = 0, 0
    for i, episode_id in enumerate(episode_ids):
        episode = calls[episode_id]
        generated_tokens += sum(len(call.output_token_ids) for call in episode)
        breaks += first_context_break(episode) is not None
        samples = [_fit(sample.message_log, max_seq_len) for sample in episode_samples(episode, tokenizer)]
        if not samples:
            loss_multiplier[i] = 0.0  # nothing the policy generated to train on
            for message in batch["message_log"][i]:
                message.setdefault(GENERATION_LOGPROBS, torch.zeros(len(message["token_ids"]), dtype=torch.float32))
            continue
        batch["message_log"][i], truncated[i] = samples[0]
        extra[i] = [log for log, _ in samples[1:]]
        truncated[i] |= any(cut for _, cut in samples[1:])

    failed = [result.failure is not None for result in results]
    batch["loss_multiplier"] = loss_multiplier
    batch["total_reward"] = torch.tensor([result.reward for result in results], dtype=torch.float32)
    batch["truncated"] = truncated
    batch["turns"] = turns
    batch["extracted_answers"] = [None] * size
    batch[EXTRA_SAMPLES] = extra
    metrics = {
        "mean_turns": turns.float().mean().item(),
        "truncation_rate": truncated.float().mean().item(),
        "natural_termination_rate": 1.0 - sum(failed) / max(size, 1),
        "total_generated_tokens": float(generated_tokens),
        "mean_generation_length": generated_tokens / max(1, size),
        "agent/no_call_rate": float((turns == 0).float().mean()),
        "agent/context_break_rate": breaks / max(size, 1),
        "agent/samples_per_episode": sum(1 + len(more) for more in extra) / max(size, 1),
        **failure_metrics(results),
    }
    return batch, metrics


def _play_episodes(
    generation: Any, input_batch: BatchedDataDict, agent_env: Any
) -> tuple[list[str], list[EpisodeResult], dict[str, list[Any]]]:
    """The agent plays one episode per row: (episode ids, their results, the engine calls each made)."""
    run = uuid.uuid4().hex[:12]
    episode_ids = [f"{run}-{i}" for i in range(input_batch.size)]
    infos, indices = input_batch["extra_env_info"], input_batch["idx"]
    rows = [{**dict(info or {}), "idx": int(idx)} for info, idx in zip(infos, indices, strict=True)]
    episodes = agent_env.run_episodes.remote(
        rows, episode_ids, generation.http_url, len(generation.http_urls), generation.api_key
    )
    watchdog.track_actor(episodes, agent_env, "run_episodes")
    results: list[EpisodeResult] = ray.get(episodes)
    return episode_ids, results, generation.take_served_calls(episode_ids)


def _fit(message_log: list[dict[str, Any]], max_seq_len: int) -> tuple[list[dict[str, Any]], bool]:
    """The log cut to its first ``max_seq_len`` tokens, and whether it was cut."""
    kept: list[dict[str, Any]] = []
    room = max_seq_len
    for message in message_log:
        if room <= 0:
            return kept, True
        length = len(message["token_ids"])
        if length > room:
            cut = dict(message, token_ids=message["token_ids"][:room])
            cut[GENERATION_LOGPROBS] = message[GENERATION_LOGPROBS][:room]
            return [*kept, cut], True
        kept.append(message)
        room -= length
    return kept, False


def expand_agent_samples(
    batch: BatchedDataDict, rewards: torch.Tensor, advantages: torch.Tensor, multiple_of: int
) -> tuple[BatchedDataDict, torch.Tensor, torch.Tensor, int]:
    """One row per training sample, and how many there are: an episode's extra samples (``agent_extra_samples``)
    become rows after its own, with its reward and advantage (the group baseline is over episodes, not calls). When
    there are extra samples, rows that train on nothing (loss multiplier 0) follow the samples up to a multiple of
    ``multiple_of`` (the global batch size the trainer splits by). A batch without extra samples comes back as it
    is."""
    extra = batch.get(EXTRA_SAMPLES)
    if not extra or not any(extra):
        return batch, rewards, advantages, batch.size
    rows = [i for i, more in enumerate(extra) for _ in range(1 + len(more))]
    logs = [log for i, more in enumerate(extra) for log in (batch["message_log"][i], *more)]
    samples = len(rows)
    padding = -samples % multiple_of
    rows += [rows[-1]] * padding
    expanded = batch.select_indices(rows)
    expanded["message_log"] = logs + [logs[-1]] * padding
    expanded[EXTRA_SAMPLES] = [[] for _ in rows]
    expanded["loss_multiplier"][samples:] = 0.0
    index = torch.tensor(rows)
    return expanded, rewards[index], advantages[index], samples
